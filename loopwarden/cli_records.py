"""Commands for the people who keep and reproduce runs: ``export``, ``replay``, ``retention``.

The logic lives in :mod:`loopwarden.records` (what a run left, the archive, the sweep) and
:mod:`loopwarden.replay` (an export as a scenario, the divergence report)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from loopwarden.cli_common import FAILED, OK, TIMED_OUT, UserError, connected, json_safe, say, settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "export",
        help="write one run's whole record as a JSON file (replayable)",
        description="Everything a run did in one file (schemas/records/RunRecord.json); read from the archive "
        "(LW_ARCHIVE_DIR / LW_ARCHIVE_BUCKET) once its records expired.",
    )
    p.add_argument("run", metavar="RUN", help="the run id")
    p.add_argument("-o", "--output", metavar="FILE", help="file to write (default: standard output)")
    p.set_defaults(func=cmd_export)
    p = sub.add_parser(
        "replay",
        help="replay an exported run and report where the current code diverges",
        description="Runs the recorded model turns and tool results through the current code (the scripted "
        "provider: no API key needed) and reports the first different Decide row, validation result or budget "
        "action. Exit 1 when the replay diverges. A dry run: a call the export holds no recorded output for "
        "is refused (exit 1), and a tool asked for more than was recorded fails visibly instead of running, "
        "unless --allow-live-tools.",
    )
    p.add_argument("file", metavar="FILE", help="a file written by `loopwarden export`")
    p.add_argument(
        "--allow-live-tools",
        action="store_true",
        help="run the real tool for calls the export has no recorded output for (side effects happen)",
    )
    p.add_argument("--save", metavar="YAML", help="write the replay scenario here instead of running it")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the replayed run (default 120)")
    p.set_defaults(func=cmd_replay)
    p = sub.add_parser(
        "retention",
        help="apply retention: archive and purge finished runs' records (admin)",
        description="Purges the records of runs finished longer than LW_RETENTION_RUNS_S ago and of queue items "
        "resolved longer than LW_RETENTION_ESCALATIONS_S ago; a running or waiting run is never purged.",
    )
    p.add_argument(
        "--every",
        type=float,
        nargs="?",
        const=0.0,
        metavar="SEC",
        help="keep sweeping, every SEC seconds (no value: LW_RETENTION_SWEEP_S); without it, sweep once",
    )
    p.set_defaults(func=cmd_retention)


async def cmd_export(args: argparse.Namespace) -> int:
    from loopwarden.records import RecordNotFound

    if args.output and not Path(args.output).resolve().parent.is_dir():  # noqa: ASYNC240 (checked before connecting)
        raise UserError(f"--output {args.output}: no such folder")
    async with connected() as client:
        try:
            record = await client.export(args.run)
        except RecordNotFound as err:
            raise UserError(str(err), FAILED) from None
    body = record.model_dump_json(by_alias=True, indent=2)
    if args.output:
        await asyncio.to_thread(Path(args.output).write_text, body + "\n")
        say(f"wrote {args.output}: run {record.run_id} ({record.status}), {len(record.events)} events", err=True)
    else:
        say(json_safe(body))
    return OK


def cmd_replay(args: argparse.Namespace) -> Any:
    from pydantic import ValidationError

    from loopwarden.replay import LiveToolsRefused, load_record, scenario_yaml, unrecorded_calls
    from shared.describe import describe

    try:  # the local file first: a bad one never waits for a connection
        record = load_record(args.file)
    except ValidationError as err:
        raise UserError(f"{args.file}: not a run export: {describe(err)}") from None
    except OSError as err:
        raise UserError(f"{args.file}: cannot read it: {err.strerror or err}") from None
    if args.save:
        Path(args.save).write_text(scenario_yaml(record, Path(args.save).stem, args.allow_live_tools))
        say(f"wrote {args.save}")
        return OK
    if not args.allow_live_tools and (calls := unrecorded_calls(record)):  # before connecting
        raise UserError(str(LiveToolsRefused(calls)), FAILED)
    return _replay(record, args.timeout, args.allow_live_tools)


async def _replay(record: Any, timeout: float, allow_live_tools: bool) -> int:
    from loopwarden.replay import replay

    async with connected(settings()) as client:
        try:
            report = await replay(client, record, timeout=timeout, allow_live_tools=allow_live_tools)
        except TimeoutError:
            raise UserError(
                f"the replayed run did not end within {timeout:.0f}s; it may wait for a person "
                "(`loopwarden escalations list`: a tool asked for more than the export recorded is not run)",
                TIMED_OUT,
            ) from None
    say("\n".join(report.lines()))
    return OK if report.same else FAILED


async def cmd_retention(args: argparse.Namespace) -> int:
    from loopwarden.records import sweep

    cfg = settings()
    async with connected(cfg) as client:
        while True:
            r = await sweep(client.bus, cfg)
            say(
                f"retention: {r.runs_seen} runs, {len(r.runs_purged)} purged, {len(r.runs_archived)} archived, "
                f"{r.runs_kept_unfinished} unfinished kept, {len(r.escalations_purged)} queue items purged, "
                f"{len(r.errors)} errors"
            )
            for line in r.errors:
                say(f"  {line}", err=True)
            if args.every is None:
                return FAILED if r.errors else OK
            await asyncio.sleep(args.every or cfg.retention_sweep_s)
