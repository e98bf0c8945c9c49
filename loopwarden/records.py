"""Run records on the server: export one run, archive finished runs, and the retention sweeper.

* ``export_run`` reads everything a run left (run state, model calls, tool ledger, verdicts,
  escalations, budget ledger, scenario, events) into one ``shared.records.RunRecord``; a run whose
  records already expired is read from the archive (``LW_ARCHIVE_DIR`` or ``LW_ARCHIVE_BUCKET``).
* ``sweep`` applies retention: a run finished (completed, stopped, failed) more than
  ``LW_RETENTION_RUNS_S`` ago is archived (when an archive is configured) and its records are purged
  from every stream and bucket; a run still running or waiting on a human is never touched, whatever
  its age (the event stream has no age limit of its own: ``LW_EVT_MAX_AGE_S`` defaults to none).
  Queue items (the human decisions, the audit trail) follow ``LW_RETENTION_ESCALATIONS_S`` after
  their resolution; an open or claimed item never expires. ``loopwarden retention`` runs it.

Purging uses the stream API (subject-filtered purge), an admin right: run the sweeper with the
admin user where ``auth.conf`` is loaded.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from nats.js.api import ObjectStoreConfig, StorageType
from nats.js.client import JetStreamContext
from nats.js.errors import BucketNotFoundError, NotFoundError, ObjectNotFoundError
from nats.js.object_store import ObjectStore

from loopwarden.record_sources import Direct, RunSource, run_id_ok
from loopwarden.record_sources import prefixed_values as prefixed_values  # where readers found it
from loopwarden.record_sources import run_events as run_events  # where readers found it
from shared import subjects as S
from shared.bus import Bus, kv_keys
from shared.messages import ESCALATION_ID_PATTERN, call_attempts, utcnow
from shared.records import (
    ModelCallRecord,
    RunRecord,
    ToolAttemptRecord,
    ToolCallExport,
    escalation_expired,
    run_expired,
)
from shared.settings import Settings

log = logging.getLogger("loopwarden.records")

HISTORY_BUCKET: str | None = getattr(S, "KV_HISTORY", None)  # the conversation beside the record, where it is kept

# Buckets holding a run's records under keys that start with the run id: (bucket, key filter suffix).
RUN_KEYS: tuple[tuple[str, str], ...] = (
    (S.KV_MODEL_CALLS, ".>"),
    (S.KV_TOOL_LEDGER, ".>"),
    (S.KV_SCRIPT_CURSORS, ".>"),
    (S.KV_BUDGETS, ""),
    (S.KV_SCENARIOS, ""),
    *(((HISTORY_BUCKET, ".>"),) if HISTORY_BUCKET else ()),  # the conversation, where it is kept apart
)


class RecordNotFound(LookupError):
    pass


# --- reading ---------------------------------------------------------------------------------------


async def conversation(source: RunSource, run_id: str, state: dict[str, Any]) -> list[dict[str, Any]]:
    """The whole conversation: in the run state, or (where the record keeps only a tail) every message
    stored under ``<run>.<seq>`` in the history bucket, then the record's tail."""
    if state.get("messages") or HISTORY_BUCKET is None or "tail" not in state:
        return list(state.get("messages") or [])
    by_seq: dict[int, dict[str, Any]] = {}
    for key, message in (await source.prefixed(HISTORY_BUCKET, run_id)).items():
        with contextlib.suppress(ValueError):
            by_seq[int(key.rsplit(".", 1)[-1])] = message
    for i, message in enumerate(state.get("tail") or []):
        by_seq[int(state.get("tail_from") or 0) + i] = message
    return [by_seq[k] for k in sorted(by_seq)]


async def collect(reader: Bus | RunSource, run_id: str) -> RunRecord:
    """Everything the run left on the server, as one record (``reader``: a bus to read it directly, or a
    ``RunSource``)."""
    source: RunSource = Direct(reader) if isinstance(reader, Bus) else reader
    state = await source.value(S.KV_RUNS, run_id, run_id) if run_id_ok(run_id) else None
    if state is None:
        raise RecordNotFound(f"run {run_id[:80]}: no run state (never submitted, or its records expired)")
    events, trace_id = await source.events(run_id)
    model_raw = await source.prefixed(S.KV_MODEL_CALLS, run_id)
    ledger = await source.prefixed(S.KV_TOOL_LEDGER, run_id)
    messages = await conversation(source, run_id, state)

    calls: list[ModelCallRecord] = []
    assistant_at = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    for key, resp in model_raw.items():
        tail = key.rsplit(".", 1)[-1]
        purpose = "plan" if tail.startswith("turn") else "summarize"
        n = int("".join(ch for ch in tail if ch.isdigit()) or 0)
        calls.append(ModelCallRecord(key=key, purpose=purpose, n=n, response=resp))
    calls.sort(key=lambda c: (c.purpose, c.n))
    if not state.get("compactions"):  # without a compaction, request k carried every message before answer k
        for k, call in enumerate(c for c in calls if c.purpose == "plan"):
            if k < len(assistant_at):
                call.request_messages = assistant_at[k]

    tool_calls: dict[str, ToolCallExport] = {}
    for e in events:
        p = e.payload
        aid = p.get("attempt_id")
        if not aid:
            continue
        tc = tool_calls.setdefault(
            aid,
            ToolCallExport(
                attempt_id=aid,
                iteration=int(p.get("iteration") or 0),
                call_id=str(p.get("call_id", "")),
                tool=str(p.get("tool", "")),
            ),
        )
        if e.kind.startswith("tool.attempt."):
            tc.attempts.append(ToolAttemptRecord.model_validate(p))
        elif (e.kind.startswith("tool.succeeded.") or e.kind.startswith("failure.")) and not p.get("will_retry"):
            tc.outcome = p
            tc.iteration = int(p.get("iteration") or tc.iteration)
            tc.arguments = p.get("arguments") or tc.arguments
    for tc in tool_calls.values():  # the attempt that returned the output has no event of its own
        made = call_attempts(int((tc.outcome or {}).get("attempts") or 0), len(tc.attempts))
        if made > len(tc.attempts):
            tc.attempts.append(ToolAttemptRecord(attempt=made, ok=True))
    for key, entry in ledger.items():
        aid = str(entry.get("attempt_id") or key)
        found = tool_calls.get(aid)
        final = entry.get("final") or {}
        if found is None or not final or not str(final.get("subject", "")).startswith(S.RESULT_VALIDATE):
            continue
        raw = json.loads(final["payload"])
        found.raw_output, found.output_is_text, found.has_output = (
            raw.get("output"),
            bool(raw.get("output_is_text")),
            True,
        )
        found.arguments = raw.get("arguments") or found.arguments

    verdict_ids = [
        str(e.payload["candidate_id"]) for e in events if e.kind == "judge.verdict" and e.payload.get("candidate_id")
    ]
    verdicts = [
        v for cid in dict.fromkeys(verdict_ids) if (v := await source.value(S.KV_VERDICTS, S.kv_key(cid), run_id))
    ]
    esc_ids = [
        str(e.payload.get("escalation_id") or (e.payload.get("detail") or {}).get("escalation_id") or "")
        for e in events
        if e.kind.startswith("escalation.") or e.kind == "run.escalated"
    ]
    escalations = [
        x
        for eid in dict.fromkeys(i for i in esc_ids if re.fullmatch(ESCALATION_ID_PATTERN, i))
        if (x := await source.value(S.KV_ESCALATIONS, eid, run_id))
    ]
    budget = await source.value(S.KV_BUDGETS, S.kv_key(run_id), run_id)
    scenario = await source.value(S.KV_SCENARIOS, run_id, run_id)
    config = dict(state.get("config") or {})
    return RunRecord(
        run_id=run_id,
        exported_at=utcnow(),
        task=str(state.get("task", "")),
        status=str(state.get("status", "")),
        final_output=state.get("final_output"),
        final_reason=state.get("final_reason"),
        passed=state.get("passed"),
        created_at=state.get("created_at"),
        updated_at=state.get("updated_at"),
        trace_id=trace_id,
        provider="scripted" if scenario is not None else "live",
        config=config,
        usage=dict(state.get("usage") or {}),
        messages=messages,
        model_calls=calls,
        tool_calls=sorted(tool_calls.values(), key=lambda t: (t.iteration, t.attempt_id)),
        verdicts=verdicts,
        escalations=escalations,
        budget=budget,
        scenario=scenario,
        events=events,
        state={k: v for k, v in state.items() if k not in ("outbox", "applied")},
    )


# --- archive -------------------------------------------------------------------------------------------


def _read_file(settings: Settings, run_id: str, *, probe: bool = False) -> bytes | None:
    if settings.archive_dir is None:
        return None
    path = Path(settings.archive_dir) / f"{run_id}.json"
    if not path.exists():
        return None
    return b"" if probe else path.read_bytes()


def _write_file(archive_dir: str, run_id: str, body: bytes) -> str:
    """The record as ``<archive_dir>/<run>.json``, readable by its owner only (0600; a folder it creates is
    0700): a record holds the task, tool arguments and outputs of someone's run."""
    folder = Path(archive_dir)
    if not folder.is_dir():
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(folder, 0o700)  # whatever the umask
    tmp = folder / f".{run_id}.json.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        os.fchmod(out.fileno(), 0o600)  # a leftover temp file keeps its mode through O_CREAT
        out.write(body)
    tmp.replace(folder / f"{run_id}.json")
    return str(folder / f"{run_id}.json")


async def archive_store(bus: Bus, settings: Settings) -> ObjectStore | None:
    if not settings.archive_bucket:
        return None
    js = bus.js
    try:
        return await js.object_store(settings.archive_bucket)
    except BucketNotFoundError:
        return await js.create_object_store(
            settings.archive_bucket,
            ObjectStoreConfig(
                description="exported run records (loopwarden export), kept after the runs' records expire",
                storage=StorageType.FILE,
                replicas=settings.kv_replicas,
            ),
        )


async def archived(bus: Bus, settings: Settings, run_id: str) -> RunRecord | None:
    """The archived record of ``run_id``, if an archive holds one."""
    body = _read_file(settings, run_id)
    if body is not None:
        return RunRecord.model_validate_json(body)
    store = await archive_store(bus, settings)
    if store is not None:
        with contextlib.suppress(ObjectNotFoundError, NotFoundError):
            result = await store.get(f"{run_id}.json")
            return RunRecord.model_validate_json(bytes(result.data or b""))
    return None


async def is_archived(bus: Bus, settings: Settings, run_id: str) -> bool:
    if _read_file(settings, run_id, probe=True) is not None:
        return True
    store = await archive_store(bus, settings)
    if store is not None:
        with contextlib.suppress(ObjectNotFoundError, NotFoundError):
            await store.get_info(f"{run_id}.json")
            return True
    return False


async def archive(bus: Bus, settings: Settings, record: RunRecord) -> list[str]:
    """Write the record to every configured archive; returns where it went."""
    body = record.model_dump_json(by_alias=True).encode()
    where = []
    if settings.archive_dir is not None:
        where.append(_write_file(settings.archive_dir, record.run_id, body))
    store = await archive_store(bus, settings)
    if store is not None:
        await store.put(f"{record.run_id}.json", body)
        where.append(f"object store {settings.archive_bucket}/{record.run_id}.json")
    return where


async def export_run(bus: Bus, settings: Settings, run_id: str) -> RunRecord:
    """The run's record: from the server while its records are there, else from the archive."""
    if not run_id_ok(run_id):  # names no run, and never a key, a subject or an archive file
        raise RecordNotFound(f"run {run_id[:80]}: not a run id")
    try:
        return await collect(bus, run_id)
    except RecordNotFound:
        record = await archived(bus, settings, run_id)
        if record is None:
            raise
        return record


# --- retention -------------------------------------------------------------------------------------------


@dataclass
class SweepReport:
    runs_seen: int = 0
    runs_purged: list[str] = field(default_factory=list)
    runs_archived: list[str] = field(default_factory=list)
    runs_kept_unfinished: int = 0
    escalations_purged: list[str] = field(default_factory=list)
    commands_purged_below: int = 0
    errors: list[str] = field(default_factory=list)


async def _keys(bus: Bus, bucket: str) -> list[str]:
    try:
        return await kv_keys(bus.nc, bucket)
    except NotFoundError:  # a bucket never created holds no keys
        return []


async def purge_bucket(js: JetStreamContext, bucket: str, keys: str) -> None:
    """Purge ``keys`` (a key or a ``.>`` pattern) from a bucket; a bucket never created (nothing of
    its kind was ever written, e.g. no tool ran on this deployment yet) holds nothing to purge."""
    with contextlib.suppress(NotFoundError):
        await js.purge_stream(f"KV_{bucket}", subject=f"$KV.{bucket}.{keys}")


async def purge_run(bus: Bus, run_id: str, *, keep_escalation_events: bool) -> None:
    """Remove every record of one run: events, model calls, ledger, cursors, budget, scenario, verdicts,
    then the run state last (a sweep cut short finds the run again next time)."""
    js = bus.js
    run = S.token(run_id)
    verdicts = [
        str(e.payload["candidate_id"])
        for e in (await run_events(bus, run_id))[0]
        if e.kind == "judge.verdict" and e.payload.get("candidate_id")
    ]
    for cid in dict.fromkeys(verdicts):
        await purge_bucket(js, S.KV_VERDICTS, S.kv_key(cid))
    for bucket, suffix in RUN_KEYS:
        await purge_bucket(js, bucket, f"{S.kv_key(run_id)}{suffix}")
    for filt in S.run_filters(run_id):
        if not keep_escalation_events:
            await js.purge_stream(S.STREAM_EVT, subject=filt)
            continue
        info = await js.stream_info(S.STREAM_EVT, subjects_filter=filt)
        for subject in (info.state.subjects or {}) if info.state else {}:
            if not subject.startswith(S.ESCALATION_EVENT_PREFIX + "."):
                await js.purge_stream(S.STREAM_EVT, subject=subject)
    assert run  # the run token is what the filters above end with
    await js.purge_stream(f"KV_{S.KV_RUNS}", subject=f"$KV.{S.KV_RUNS}.{S.kv_key(run_id)}")


async def purge_handled_commands(bus: Bus) -> int:
    """Remove the commands every durable consumer has handled, in LW_CMD and in LW_SUBMIT (submits and
    requeues): nothing reads an acknowledged command again (a redelivery is of an unacknowledged one;
    de-duplication ids outlive a purge). Returns LW_CMD's sequence below which commands were purged (0: none)."""
    below = await _purge_handled(bus.js, S.STREAM_CMD)
    await _purge_handled(bus.js, S.STREAM_SUBMIT)
    return below


async def _purge_handled(js: JetStreamContext, stream: str) -> int:
    last = (await js.stream_info(stream)).state.last_seq  # read before the consumers: see below
    floors = []
    for info in await js.consumers_info(stream):
        if not info.config.durable_name:
            continue  # an ordered reader holds nothing back
        if not info.num_pending and not info.num_ack_pending:
            floors.append(last)  # everything it was sent up to `last` is acknowledged
        else:
            floors.append(info.ack_floor.stream_seq if info.ack_floor else 0)
    below = min(floors, default=0)
    if below > 0:
        await js.purge_stream(stream, seq=below + 1)
    return below


async def sweep(bus: Bus, settings: Settings, now: datetime | None = None, only: set[str] | None = None) -> SweepReport:
    """One retention pass over every run and queue item (``only``: just these runs' records)."""
    now = now or utcnow()
    report = SweepReport()
    esc_kv = await bus.kv(S.KV_ESCALATIONS)
    direct = Direct(bus)

    items: dict[str, dict[str, Any]] = {}
    for key in await _keys(bus, S.KV_ESCALATIONS):
        item = await direct.value(S.KV_ESCALATIONS, key, "")
        if item is not None:
            items[key] = item
    open_runs = {str(i.get("run_id")) for i in items.values()}
    archiving = settings.archive_dir is not None or bool(settings.archive_bucket)

    for key in await _keys(bus, S.KV_RUNS):
        if only is not None and key not in only:
            continue
        report.runs_seen += 1
        try:
            state = await direct.value(S.KV_RUNS, key, key)
            if state is None:
                continue
            status = str(state.get("status", ""))
            updated = datetime.fromisoformat(str(state.get("updated_at")).replace("Z", "+00:00"))
            if status not in ("completed", "stopped", "failed"):
                report.runs_kept_unfinished += 1
                continue
            run_id = str(state.get("run_id", key))
            if archiving and not await is_archived(bus, settings, run_id):
                await archive(bus, settings, await collect(bus, run_id))
                report.runs_archived.append(run_id)
            if run_expired(status, updated, now, settings.retention_runs_s):
                await purge_run(bus, run_id, keep_escalation_events=run_id in open_runs)
                report.runs_purged.append(run_id)
        except Exception as err:  # one bad record never stops the sweep
            report.errors.append(f"run {key}: {err!r}")

    live_runs = set(await _keys(bus, S.KV_RUNS))
    by_run: dict[str, list[str]] = {}
    for key, item in items.items():
        if only is not None and str(item.get("run_id")) not in only:
            continue
        by_run.setdefault(str(item.get("run_id")), []).append(key)
    for run_id, keys in by_run.items():
        gone = [k for k in keys if escalation_expired(items[k], now, settings.retention_escalations_s)]
        for key in gone:
            await esc_kv.purge(key)
            report.escalations_purged.append(key)
        if len(gone) == len(keys) and S.kv_key(run_id) not in live_runs:
            for filt in S.run_filters(run_id, f"{S.ESCALATION_EVENT_PREFIX}.>"):
                await bus.js.purge_stream(S.STREAM_EVT, subject=filt)
    if only is None:
        try:
            report.commands_purged_below = await purge_handled_commands(bus)
        except Exception as err:
            report.errors.append(f"commands: {err!r}")
    for line in report.errors:
        log.warning("retention: %s", line)
    return report
