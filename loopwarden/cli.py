"""``loopwarden``: run the demo, start/stop a local stack, submit and inspect runs, work the queue."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from loopwarden.stack import LocalStack, StackError, stop_saved

STATE = Path(os.environ.get("LW_STATE_DIR", ".loopwarden"))
STACK_FILE = STATE / "stack.json"
DEFAULT_SCENARIO = Path(__file__).resolve().parents[1] / "scenarios" / "demo.yaml"


def _settings(nats_url: str | None = None) -> Any:
    from shared.settings import load_settings

    url = nats_url or os.environ.get("LW_NATS_URL") or os.environ.get("NATS_URL")
    if url is None and STACK_FILE.exists():
        url = json.loads(STACK_FILE.read_text())["nats_url"]
    return load_settings("loopwarden", **({"nats_url": url} if url else {}))


def _print(line: str | None) -> None:
    if line:
        print(line, flush=True)


# --- demo ---------------------------------------------------------------------------------------


async def _run_and_watch(nats_url: str, scenario_path: Path | None, task: str | None, timeout: float) -> int:
    from loopwarden.client import Client, new_run_id
    from loopwarden.progress import render
    from shared.messages import RunSubmit
    from shared.scenario import load_scenario

    async with Client(_settings(nats_url)) as client:
        run_id = new_run_id()
        watcher = client.watch(run_id)
        first = asyncio.ensure_future(watcher.__anext__())  # subscribe before submitting
        await asyncio.sleep(0.2)
        if scenario_path is not None:
            scenario = load_scenario(scenario_path)
            print(f"scenario: {scenario.name} ({scenario_path})")
            await client.submit_scenario(scenario, run_id)
        else:
            await client.submit(RunSubmit(run_id=run_id, task=task or ""))
        print(f"run id: {run_id}")
        pending: asyncio.Future[Any] | None = first
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                print(f"timed out after {timeout:.0f}s", file=sys.stderr)
                return 1
            assert pending is not None
            done, _ = await asyncio.wait({pending}, timeout=min(0.5, remaining))
            if done:
                event = pending.result()
                _print(render(event))
                pending = asyncio.ensure_future(watcher.__anext__())
                if event.kind in ("run.completed", "run.stopped", "run.failed"):
                    break
                if event.kind == "run.escalated":
                    print(
                        "  (waiting for a human: `loopwarden escalations list`, then `loopwarden escalations "
                        "resolve ID --action resume|abort`)"
                    )
        pending.cancel()
        state = await client.wait(run_id, timeout=5)
        print()
        print(f"run id:       {run_id}")
        print(f"status:       {state.status} — {state.final_reason}")
        print(f"iterations:   {state.iteration.n} (continues {state.continue_count}, retries {state.retry_count})")
        print(
            f"tokens:       in {state.usage.input_tokens}, out {state.usage.output_tokens}, "
            f"cost ${state.usage.cost_usd:.4f}"
        )
        if state.first_draft_passed is not None:
            print(f"first draft:  {'passed' if state.first_draft_passed else 'rejected'}")
        print(f"final answer:\n{state.final_output}")
        return 0 if state.status == "completed" else 2


def cmd_demo(args: argparse.Namespace) -> int:
    nats_url = os.environ.get("LW_NATS_URL") or os.environ.get("NATS_URL")
    stack = LocalStack(state_dir=STATE / "demo", nats_url=nats_url)
    what = "the six services" if nats_url else "nats-server (JetStream), the six services"
    print(f"starting {what} and the console ...")
    try:
        stack.start()
        print(f"stack up on {stack.nats_url} (logs in {stack.state_dir / 'logs'})")
        _print(_console_line(stack))
        scenario = None if args.live else Path(args.scenario)
        return asyncio.run(_run_and_watch(stack.nats_url or "", scenario, args.task, args.timeout))
    except KeyboardInterrupt:
        print("\ninterrupted: stopping everything", file=sys.stderr)
        return 130
    except StackError as err:
        print(f"could not start the stack: {err}", file=sys.stderr)
        return 1
    finally:
        stack.stop()
        print("stopped nats-server and the services.")


# --- up / down ----------------------------------------------------------------------------------


def cmd_up(args: argparse.Namespace) -> int:
    if STACK_FILE.exists():
        print(f"a stack is already recorded in {STACK_FILE}; run `loopwarden down` first", file=sys.stderr)
        return 1
    stack = LocalStack(state_dir=STATE / "stack", nats_url=os.environ.get("LW_NATS_URL"), detach=True)
    try:
        stack.start()
    except StackError as err:
        stack.stop()
        print(f"could not start the stack: {err}", file=sys.stderr)
        return 1
    stack.save(STACK_FILE)
    print(f"up: {stack.nats_url}; logs in {stack.state_dir / 'logs'}; `loopwarden down` stops it")
    _print(_console_line(stack))
    return 0


def _console_line(stack: LocalStack) -> str | None:
    if stack.console_url is None:
        return None
    where = f" (operator passwords in {stack.console_passwords})" if stack.console_passwords else ""
    return f"console: {stack.console_url}{where}"


async def _bootstrap(args: argparse.Namespace) -> int:
    """Create or update streams, buckets and every service's durable consumers (admin user)."""
    from loopwarden.infra import bootstrap
    from shared import subjects as S

    settings = _settings()
    report = await bootstrap(settings)
    for line in report.changed:
        print(line)
    print(
        f"streams {', '.join(S.STREAM_SUBJECTS)} (replicas {settings.stream_replicas}), "
        f"{len(S.ALL_BUCKETS)} buckets (replicas {settings.kv_replicas}) and "
        f"{len(report.consumers)} consumers are in place"
    )
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    stopped = stop_saved(STACK_FILE)
    print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    return 0


# --- runs ---------------------------------------------------------------------------------------


async def _submit(args: argparse.Namespace) -> int:
    from loopwarden.client import Client, new_run_id
    from shared.messages import RunSubmit
    from shared.scenario import ScenarioError, load_scenario

    async with Client(_settings()) as client:
        if args.scenario:
            try:
                scenario = load_scenario(args.scenario)
            except ScenarioError as err:
                print(err, file=sys.stderr)
                return 2
            if args.wait:
                state, mismatches = await client.run_and_check(scenario, timeout=args.timeout)
                print(state.run_id)
                print(f"{state.status}: {state.final_output}")
                for line in mismatches:
                    print(f"EXPECTATION NOT MET: {line}", file=sys.stderr)
                return 1 if mismatches else 0
            run_id = await client.submit_scenario(scenario)
        else:
            run_id = await client.submit(RunSubmit(run_id=new_run_id(), task=args.task))
        print(run_id)
        if args.wait:
            state = await client.wait(run_id, timeout=args.timeout)
            print(f"{state.status}: {state.final_output}")
        return 0


async def _status(args: argparse.Namespace) -> int:
    from loopwarden.client import Client

    async with Client(_settings()) as client:
        state = await client.state(args.run_id)
        if state is None:
            print(f"no run {args.run_id}", file=sys.stderr)
            return 1
        print(
            json.dumps(
                {
                    "run_id": state.run_id,
                    "status": state.status,
                    "reason": state.final_reason,
                    "iteration": state.iteration.n,
                    "continues": state.continue_count,
                    "retries": state.retry_count,
                    "usage": state.usage.model_dump(),
                    "passed": state.passed,
                    "first_draft_passed": state.first_draft_passed,
                    "awaiting": state.awaiting.model_dump() if state.awaiting else None,
                    "warnings": state.warnings,
                    "final_output": state.final_output,
                },
                indent=2,
                ensure_ascii=False,
            )
        )
        return 0


async def _events(args: argparse.Namespace) -> int:
    from loopwarden.client import Client
    from loopwarden.progress import render

    async with Client(_settings()) as client:
        for event in await client.events(args.run_id):
            if args.json:
                print(json.dumps({"subject": event.subject, **event.payload}, ensure_ascii=False))
            else:
                _print(render(event))
        return 0


async def _escalations(args: argparse.Namespace) -> int:
    from loopwarden.client import Client

    settings = _settings()
    # An operator's NATS user may publish only its own subjects and read only its own inbox.
    who = getattr(args, "who", None) or settings.nats_user or os.environ.get("USER", "operator")
    async with Client(settings, identity=settings.nats_user or "client") as client:
        if args.action == "list":
            reply = await client.escalations(
                args.status,
                args.run,
                kind=args.kind,
                tool=args.tool,
                older_than_s=args.older_than,
                newer_than_s=args.newer_than,
            )
        elif args.action == "show":
            reply = await client.show(args.id)
        elif args.action == "claim":
            reply = await client.claim(args.id, who)
        elif args.action == "renew":
            reply = await client.renew(args.id, who)
        else:
            result = _json_arg(args.result) if args.result else None
            if args.decision == "final_answer" and args.answer is not None:
                result = args.answer
            reply = await client.resolve(args.id, who, args.decision, args.note, result)
        if not reply.ok:
            print(reply.error, file=sys.stderr)
            return 1
        if args.action == "show":
            print(reply.escalations[0].model_dump_json(indent=2))
            return 0
        for item in reply.escalations:
            lease = f"  lease until {item.lease_expires_at:%H:%M:%S}" if item.lease_expires_at else ""
            holder = f" by {item.claimed_by}" if item.claimed_by else ""
            print(
                f"{item.escalation_id}  {item.status + holder:16}  {item.kind:15}  tool {item.tool or '-':14}  "
                f"run {item.run_id}  {item.reason[:80]}{lease}"
            )
        for key in reply.unreadable:
            print(f"{key}  UNREADABLE (the record does not parse; `escalations show {key}` says why)", file=sys.stderr)
        return 0


async def _metrics(args: argparse.Namespace) -> int:
    from loopwarden.client import Client

    async with Client(_settings()) as client:
        metrics = await client.tool_metrics()
    print(
        f"{'tool':16} {'outputs':>7} {'parse':>6} {'valid':>6} {'repair':>6} {'schema✗':>7} {'corrected':>9} "
        f"{'attempts':>8} {'retried':>7}"
    )
    for tool, m in metrics.items():
        print(
            f"{tool:16} {m['outputs']:7.0f} {m['parse_success_rate']:6.0%} {m['validation_pass_rate']:6.0%} "
            f"{m['repair_rate']:6.0%} {m['schema_failures']:7.0f} {m['correction_success_rate']:9.0%} "
            f"{m['attempts']:8.0f} {m['retried_attempts']:7.0f}"
        )
    return 0


async def _dlq(args: argparse.Namespace) -> int:
    from loopwarden.client import Client

    async with Client(_settings()) as client:
        for letter in await client.dead_letters():
            print(f"{letter.at:%H:%M:%S} {letter.service:10} {letter.subject}: {letter.reason}")
    return 0


def cmd_lint(args: argparse.Namespace) -> int:
    """Registration errors (refused) and softer problems, for every contract the executor would load."""
    from services.executor.app import load_registry
    from shared.contracts.lint import lint_contract

    settings = _settings()
    registry = load_registry(settings)
    mcp_lines: list[str] = []
    if settings.mcp_server_specs:  # start the mounted MCP servers as the executor would, then stop them
        from services.executor.mcp_tools import inspect_servers

        mcp_lines = asyncio.run(inspect_servers(registry, settings.mcp_server_specs))
    for name, reason in sorted(registry.refused.items()):
        print(f"REFUSED {name}: {reason}")
    for line in mcp_lines:
        print(line)
    issues = [i for t in registry.tools.values() for i in lint_contract(t.declared)]
    for issue in issues:
        print(f"lint    {issue}")
    print(f"{len(registry.tools)} tool(s) registered, {len(registry.refused)} refused, {len(issues)} lint note(s)")
    return 1 if registry.refused else 0


def _json_arg(value: str) -> Any:
    text = Path(value[1:]).read_text() if value.startswith("@") else value
    return json.loads(text)


def cmd_check_contract(args: argparse.Namespace) -> int:
    """Register a contract file as the executor would; optionally check an input or an output."""
    from services.validator.checking import check_output
    from shared.contracts.dialect import ContractError
    from shared.contracts.registration import load_contract_file, register_contract, validator_for
    from shared.contracts.validation import format_for_model

    if args.call and not args.path.startswith("mcp:"):
        print("--call needs an mcp:<server>/<tool> path")
        return 2
    mcp_tool, called = _mcp_contract(args) if args.path.startswith("mcp:") else (None, None)  # mcp:<server>/<tool>
    if isinstance(mcp_tool, str):
        print(f"REFUSED {mcp_tool}")
        return 2
    try:
        if mcp_tool is not None:
            contract = mcp_tool
        else:
            declared, _, _ = load_contract_file(Path(args.path))
            contract = register_contract(declared, _settings().default_schema_dialect)
    except (ValueError, ContractError) as err:
        print(f"REFUSED {err}")
        return 2
    print(f"registered {contract.name} (dialect {contract.dialect}, fingerprint {contract.fingerprint})")
    mcp_text = contract.output_schema.get("x-loopwarden-mcp") == "content"  # its output is text as sent
    status = 0
    if args.input is not None:
        errors = validator_for(contract, "input").errors(_json_arg(args.input))
        print("input: valid" if not errors else f"input: invalid\n{format_for_model(errors)}")
        status = status or (1 if errors else 0)
    if args.output is not None:
        raw_text = args.output[1:] if args.output.startswith("@") else None
        output = Path(raw_text).read_text() if raw_text else args.output
        checked = check_output(contract, _offline_result(contract, json.dumps(output) if mcp_text else output, True))
        outcome = checked.outcome
        if outcome.success:
            note = f" ({'; '.join(outcome.repairs)})" if outcome.repaired else ""
            print(f"output: {checked.result}{note}")
        else:
            print(f"output: {checked.result}\n{format_for_model(outcome.errors)}")
            status = status or 1
    if args.call:
        status = _mcp_call(args, contract, called) or status
    return status


def _offline_result(contract: Any, output: Any, is_text: bool) -> Any:
    """An output checked outside any run (``check-contract``), shaped as the validator receives it."""
    from shared.messages import ToolResultRaw

    return ToolResultRaw(
        run_id="cli",
        iteration=1,
        call_id="cli",
        attempt_id="cli",
        tool=contract.name,
        requested_tool=contract.name,
        arguments={},
        output=output,
        output_is_text=is_text,
    )


def _mcp_contract(args: argparse.Namespace) -> tuple[Any, Any]:
    """``mcp:<server>/<tool>``: the contract the executor registers for a mounted MCP tool (or why not),
    and with ``--call`` what one call with ``--input`` returned."""
    from services.executor.mcp_tools import probe
    from services.executor.registry import ToolRegistry

    settings = _settings()
    server, _, tool = args.path[4:].partition("/")
    specs = [s for s in settings.mcp_server_specs if s.name == server]
    if not specs or not tool:
        return f"{args.path}: expected mcp:<server>/<tool> with <server> in LW_MCP_SERVERS", None
    registry = ToolRegistry(default_dialect=settings.default_schema_dialect, boundaries=dict(settings.boundaries))
    call_args = (_json_arg(args.input) if args.input is not None else {}) if args.call else None
    lines, called = asyncio.run(probe(registry, specs[0], tool, call_args))
    for line in lines:
        print(line)
    name = f"{specs[0].prefix}{tool}"
    if name in registry.tools:
        return registry.tools[name].contract, called
    return registry.refused.get(name) or registry.refused.get(f"mcp:{server}") or f"{args.path}: no such tool", None


def _mcp_call(args: argparse.Namespace, contract: Any, called: Any) -> int:
    """``--call``: check what the MCP tool returned, as a run would."""
    from services.executor.registry import ToolFailure
    from services.validator.checking import check_output
    from shared.contracts.validation import format_for_model

    if isinstance(called, ToolFailure):
        print(f"call: {called.kind}{f' (effect: {called.effect})' if called.effect else ''}\n{called}")
        return 1
    checked = check_output(contract, _offline_result(contract, called, isinstance(called, str)))
    data = checked.outcome.data
    shown = data if isinstance(data, str) else json.dumps(data if checked.outcome.success else called)
    print(f"call: {checked.result}\n{shown[:2000]}")
    if not checked.outcome.success:
        print(format_for_model(checked.outcome.errors))
        return 1
    return 0


def cmd_check_scenario(args: argparse.Namespace) -> int:
    from shared.rubric import lint_rubric
    from shared.scenario import ScenarioError, load_scenario

    status = 0
    for path in args.paths:
        try:
            scenario = load_scenario(path)
        except ScenarioError as err:
            print(err, file=sys.stderr)
            status = 2
            continue
        found = lint_rubric(scenario.rubric) if scenario.rubric else None
        for msg in found.errors if found else []:
            print(f"{path}: rubric refused: {msg}", file=sys.stderr)
            status = 2
        for msg in found.flags if found else []:
            print(f"{path}: rubric flag: {msg}")
        print(f"{path}: ok ({len(scenario.planner)} planner turn(s), {len(scenario.judge)} judge repl(ies))")
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="loopwarden", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="start everything, run a demo agent with live progress, stop everything")
    p.add_argument("--scenario", default=str(DEFAULT_SCENARIO), help="scripted scenario to replay")
    p.add_argument("--live", action="store_true", help="no scenario: use the anthropic provider (needs a key)")
    p.add_argument("--task", default="Explain JetStream message de-duplication in two sentences.")
    p.add_argument("--timeout", type=float, default=120.0)
    p.set_defaults(func=cmd_demo)

    sub.add_parser("up", help="start nats-server and the six services in the background").set_defaults(func=cmd_up)
    sub.add_parser("down", help="stop what `up` started").set_defaults(func=cmd_down)
    sub.add_parser(
        "bootstrap", help="create/update streams, buckets and consumers (admin user; for LW_MANAGE_STREAMS=false)"
    ).set_defaults(func=lambda a: asyncio.run(_bootstrap(a)))

    p = sub.add_parser("submit", help="submit a run (a scenario file, or a task for the live provider)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--scenario")
    g.add_argument("--task")
    p.add_argument("--wait", action="store_true")
    p.add_argument("--timeout", type=float, default=120.0)
    p.set_defaults(func=lambda a: asyncio.run(_submit(a)))

    p = sub.add_parser("status", help="a run's state")
    p.add_argument("run_id")
    p.set_defaults(func=lambda a: asyncio.run(_status(a)))

    p = sub.add_parser("events", help="a run's event history (no Jaeger needed)")
    p.add_argument("run_id")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=lambda a: asyncio.run(_events(a)))

    p = sub.add_parser("escalations", help="the human queue")
    esc = p.add_subparsers(dest="action", required=True)
    q = esc.add_parser("list", help="items by state, kind, tool, run and age")
    q.add_argument("--status", "--state", default="open", choices=["open", "claimed", "resolved", "all"])
    q.add_argument("--kind")
    q.add_argument("--tool")
    q.add_argument("--run")
    q.add_argument("--older-than", type=float, metavar="SECONDS")
    q.add_argument("--newer-than", type=float, metavar="SECONDS")
    q = esc.add_parser("show", help="one item whole: context, arguments, allowed actions, trail")
    q.add_argument("id")
    who_help = "the operator (default: LW_NATS_USER); the server enforces it with per-operator users"
    for verb in ("claim", "renew"):
        q = esc.add_parser(verb)
        q.add_argument("id")
        q.add_argument("--as", "--who", dest="who", help=who_help)
    q = esc.add_parser("resolve")
    q.add_argument("id")
    q.add_argument("--as", "--who", dest="who", help=who_help)
    q.add_argument(
        "--action",
        dest="decision",
        required=True,
        choices=["resume", "abort", "provide_result", "accept", "approve", "reject", "final_answer", "retry"],
    )
    q.add_argument("--note", default="", help="the reason; for retry, the instruction for the model")
    q.add_argument("--result", help="JSON (or @file) used as the tool's result (provide_result)")
    q.add_argument("--answer", help="the final answer's text (final_answer)")
    p.set_defaults(func=lambda a: asyncio.run(_escalations(a)))

    sub.add_parser("metrics", help="per-tool contract metrics").set_defaults(func=lambda a: asyncio.run(_metrics(a)))
    sub.add_parser("dlq", help="dead-lettered messages and why").set_defaults(func=lambda a: asyncio.run(_dlq(a)))
    sub.add_parser("lint", help="check every tool contract").set_defaults(func=cmd_lint)
    p = sub.add_parser(
        "check-contract", help="register a tool contract file (or mcp:<server>/<tool>); optionally check an instance"
    )
    p.add_argument("path")
    p.add_argument("--input", help="arguments as JSON, or @file.json")
    p.add_argument("--output", help="a tool output as JSON text, or @file.json")
    p.add_argument("--call", action="store_true", help="mcp:<server>/<tool>: call it with --input, check the result")
    p.set_defaults(func=cmd_check_contract)
    p = sub.add_parser("check-scenario", help="validate scenario files")
    p.add_argument("paths", nargs="+")
    p.set_defaults(func=cmd_check_scenario)

    add_records_commands(sub)  # issue 15: export, replay, retention

    args = parser.parse_args(argv)
    with contextlib.suppress(BrokenPipeError):
        return int(args.func(args) or 0)
    return 0


# --- run records: export, replay, retention (issue 15; logic in loopwarden/records.py, replay.py) ---------


def add_records_commands(sub: Any) -> None:
    p = sub.add_parser("export", help="write one run's whole record as a JSON file (replayable)")
    p.add_argument("run")
    p.add_argument("-o", "--output", help="file to write (default: stdout)")
    p.set_defaults(func=cmd_export)
    p = sub.add_parser("replay", help="replay an exported run offline and report where the current code diverges")
    p.add_argument("file")
    p.add_argument("--save", help="write the replay scenario (YAML) here instead of running it, e.g. scenarios/x.yaml")
    p.add_argument("--timeout", type=float, default=120.0)
    p.set_defaults(func=cmd_replay)
    p = sub.add_parser("retention", help="apply retention: archive and purge finished runs' records (admin)")
    p.add_argument(
        "--every",
        type=float,
        nargs="?",
        const=0.0,
        help="keep sweeping, every SEC seconds (no value: LW_RETENTION_SWEEP_S); without it, sweep once",
    )
    p.set_defaults(func=lambda a: asyncio.run(_retention(a)))


def cmd_export(args: argparse.Namespace) -> int:
    from loopwarden.records import RecordNotFound

    try:
        record = asyncio.run(_export(args.run))
    except RecordNotFound as err:
        print(f"export: {err}", file=sys.stderr)
        return 1
    body = record.model_dump_json(by_alias=True, indent=2)
    if args.output:
        Path(args.output).write_text(body + "\n")
        print(
            f"wrote {args.output}: run {record.run_id} ({record.status}), {len(record.events)} events", file=sys.stderr
        )
    else:
        print(body)
    return 0


async def _export(run_id: str) -> Any:
    from loopwarden.client import Client
    from loopwarden.records import export_run
    from shared.settings import load_settings

    settings = load_settings("loopwarden")
    async with Client(settings) as client:
        return await export_run(client.bus, settings, run_id)


def cmd_replay(args: argparse.Namespace) -> int:
    from loopwarden.replay import load_record, scenario_yaml

    try:
        record = load_record(args.file)
    except (OSError, ValueError) as err:
        print(f"replay: {args.file}: not a run export: {err}", file=sys.stderr)
        return 2
    if args.save:
        Path(args.save).write_text(scenario_yaml(record, Path(args.save).stem))
        print(f"wrote {args.save}")
        return 0
    return asyncio.run(_replay(record, args.timeout))


async def _replay(record: Any, timeout: float) -> int:
    from loopwarden.client import Client
    from loopwarden.replay import replay
    from shared.settings import load_settings

    async with Client(load_settings("loopwarden")) as client:
        report = await replay(client, record, timeout=timeout)
    print("\n".join(report.lines()))
    return 0 if report.same else 1


async def _retention(args: argparse.Namespace) -> int:
    from loopwarden.client import Client
    from loopwarden.records import sweep
    from shared.settings import load_settings

    settings = load_settings("loopwarden")
    async with Client(settings) as client:
        while True:
            r = await sweep(client.bus, settings)
            print(
                f"retention: {r.runs_seen} runs, {len(r.runs_purged)} purged, {len(r.runs_archived)} archived, "
                f"{r.runs_kept_unfinished} unfinished kept, {len(r.escalations_purged)} queue items purged, "
                f"{len(r.errors)} errors",
                flush=True,
            )
            for line in r.errors:
                print(f"  {line}", file=sys.stderr)
            if args.every is None:
                return 1 if r.errors else 0
            await asyncio.sleep(args.every or settings.retention_sweep_s)


if __name__ == "__main__":
    sys.exit(main())
