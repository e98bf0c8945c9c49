"""Commands for whoever submits and follows runs: ``submit``, ``status``, ``events``, ``trace``,
``metrics``, ``dlq`` (and ``dlq requeue``, which hands dead letters back). Each reads through a bounded
connect (``cli_common.connected``); the reading ones take ``--json``."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from loopwarden.cli_common import (
    AWAITING_HUMAN,
    FAILED,
    OK,
    TIMED_OUT,
    UserError,
    add_json_flag,
    add_priority_flag,
    connected,
    emit_json,
    json_text,
    load_scenario_file,
    plain,
    say,
    settings,
)

if TYPE_CHECKING:
    from loopwarden.client import Client
    from shared.messages import RunSnapshot
    from shared.scenario import Scenario

ENDED = ("completed", "stopped", "failed", "refused")  # shared.messages.FINAL_STATUSES


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "submit",
        help="submit a run (a scenario file, or a task for the live provider)",
        description="Submit a run and print its id. With --wait, print its id, wait for it and print how it ended; "
        "the exit code says whether it completed (or, for a scenario with an `expect` block, ended as expected), "
        "or 5 as soon as it waits for a human, whatever `expect` says.",
    )
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--scenario", metavar="FILE", help="a scenario file: its task, replayed by the scripted provider")
    g.add_argument("--task", metavar="TEXT", help="a task for the live provider (needs ANTHROPIC_API_KEY)")
    p.add_argument("--wait", action="store_true", help="wait until the run ends or waits for a human")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds --wait waits (default: 120)")
    p.add_argument(
        "--allow-missing-tools",
        action="store_true",
        help="submit a scenario even if it calls tools the stack does not host (each such call fails: unknown_tool)",
    )
    add_priority_flag(p)
    add_json_flag(p)
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("status", help="a run's state", description="A run's status, counts, usage and answer.")
    p.add_argument("run_id", metavar="RUN", help="the run id (`submit` printed it)")
    add_json_flag(p)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser(
        "events",
        help="a run's event history (no Jaeger needed)",
        description="A run's stored events, oldest first, one line each (--json: one JSON object per line).",
    )
    p.add_argument("run_id", metavar="RUN", help="the run id")
    p.add_argument("--full", action="store_true", help="the run as a tree of steps, then every step whole")
    add_json_flag(p)
    p.set_defaults(func=cmd_events)

    p = sub.add_parser(
        "trace",
        help="a run's timeline and trace id (for Jaeger)",
        description="A run's timeline (seconds since it started, per event) and the trace id its messages carry; "
        "with tracing exported (OTEL_EXPORTER_OTLP_ENDPOINT), open LW_JAEGER_URL/trace/<id>.",
    )
    p.add_argument("run_id", metavar="RUN", help="the run id")
    add_json_flag(p)
    p.set_defaults(func=cmd_trace)

    p = sub.add_parser("metrics", help="per-tool contract metrics", description="Per tool, from the event history.")
    add_json_flag(p)
    p.set_defaults(func=cmd_metrics)

    p = sub.add_parser(
        "dlq",
        help="dead-lettered messages and why; `dlq requeue N` hands one back",
        description="Dead letters, oldest first, each with its number (its LW_DLQ sequence).",
    )
    add_json_flag(p)
    p.set_defaults(func=cmd_dlq)
    actions = p.add_subparsers(dest="dlq_action", metavar="ACTION")
    q = actions.add_parser(
        "requeue",
        help="hand dead letters back to the services that gave up on them",
        description="Hand each letter back to the service that dead-lettered it: the service runs it again "
        "through the consumer that took it, as a redelivery (once the dependency it waited for is back, or the "
        "fault is fixed). Nothing is published on the message's own subject again, so an event is not "
        "duplicated in the runs' history. If it fails again it is dead-lettered again, under a new number. "
        "Requeuing the same letter twice within the de-duplication window runs it once.",
    )
    q.add_argument("seqs", metavar="N", nargs="+", help="a letter's number (`loopwarden dlq` lists them)")
    q.set_defaults(func=cmd_requeue)

    from loopwarden import cli_runview

    cli_runview.register(sub)  # `show RUN [--step N]`: the console's run view as text


# --- submit -------------------------------------------------------------------------------------
def describe_end(state: Any) -> str:
    """One line: how a run ended (or where it waits)."""
    if state.status == "completed":
        return f"completed: {state.final_output}"
    if state.status == "awaiting_human":
        awaiting = state.awaiting
        item = f"escalation {awaiting.escalation_id} ({awaiting.kind})" if awaiting else "an escalation"
        return f"awaiting_human: {item}; `loopwarden escalations show ID`, then `escalations resolve ID --action ...`"
    return f"{state.status}: {state.final_reason or 'no reason recorded'}"


def _summary(state: Any) -> dict[str, Any]:
    return {
        "run_id": state.run_id,
        "status": state.status,
        "reason": state.final_reason,
        "priority": state.priority,
        "tenant": state.tenant,
        "waited_s": round(state.waited_s, 3),
        "refusal": state.refusal.model_dump(mode="json") if state.refusal else None,
        "iteration": state.iteration.n,
        "continues": state.continue_count,
        "retries": state.retry_count,
        "usage": state.usage.model_dump(mode="json"),
        "passed": state.passed,
        "first_draft_passed": state.first_draft_passed,
        "awaiting": state.awaiting.model_dump(mode="json") if state.awaiting else None,
        "stall": state.stall.model_dump(mode="json") if state.stall else None,
        "warnings": state.warnings,
        "final_output": state.final_output,
        "rate_limited_s": state.rate_limited_s,
    }


async def _rate_limit_wait(client: Any, run_id: str) -> Any:
    """The run's current wait for a rate limit (``RateLimited``), from its run events, or None."""
    from pydantic import ValidationError

    from shared import subjects as S
    from shared.messages import RunEvent
    from shared.ratelimit.fleet import current_wait

    typed = []
    for e in await client.events(run_id, subjects=f"{S.RUN_EVENT_PREFIX}.>"):
        try:
            typed.append(RunEvent.model_validate(e.payload).root)
        except ValidationError:  # a kind this version does not know
            continue
    return current_wait(typed, datetime.now(UTC))


async def cmd_submit(args: argparse.Namespace) -> int:
    from loopwarden.client import new_run_id
    from shared.messages import RunSubmit

    scenario = load_scenario_file(args.scenario) if args.scenario else None  # before connecting
    async with connected() as client:
        await refuse_missing_tools(client, scenario, args)
        if scenario is not None:
            run_id = await client.submit_scenario(scenario, priority=args.priority)
        else:
            run_id = await client.submit(RunSubmit(run_id=new_run_id(), task=args.task, priority=args.priority))
        return await report_run(client, run_id, scenario, args)


async def refuse_missing_tools(client: Client, scenario: Scenario | None, args: argparse.Namespace) -> None:
    """A scenario calling tools no executor of the running stack hosts is refused before anything is published
    (``--allow-missing-tools`` submits it anyway: each such call is then an ``unknown_tool`` failure)."""
    if scenario is None or args.allow_missing_tools or client.tenant_bound:
        return  # a tenant's client may not read which tools the stack hosts (the contracts are every tenant's)
    from loopwarden.cli_offline import missing_tools

    if missing := await client.guard(missing_tools(client, scenario.called_tools())):
        raise UserError(
            f"refused: {args.scenario} calls {', '.join(missing)}, which no executor of the running stack "
            "hosts (`loopwarden check-scenario --against-stack` names them; --allow-missing-tools submits "
            "anyway)",
            FAILED,
        )


async def report_run(
    client: Client,
    run_id: str,
    scenario: Scenario | None,
    args: argparse.Namespace,
    extra: Callable[[RunSnapshot], str] | None = None,
) -> int:
    """What ``submit`` and ``run`` print and exit with: the run id; with ``--wait``, how the run ended (at once
    when it waits for a human, whatever ``expect`` says) and where it differs from the scenario's ``expect``."""
    if not args.wait:
        if args.json:
            emit_json({"run_id": run_id})
        else:
            say(run_id)
        return OK
    if not args.json:
        say(run_id)  # first: whatever happens while waiting, the run can be found
    try:
        # a run that waits for a person is as far as waiting goes, whatever `expect` says
        state = await client.wait(run_id, timeout=args.timeout, until=(*ENDED, "awaiting_human"))
    except TimeoutError as err:
        raise UserError(f"timed out: {err}; `loopwarden status {run_id}` shows where it is", TIMED_OUT) from None
    mismatches = await client.check(scenario, state) if scenario is not None else []
    if args.json:
        emit_json({**_summary(state), "agent": state.agent, "expectations_not_met": mismatches})
    else:
        say(plain(describe_end(state)))
        if extra is not None:
            say(extra(state))
        for line in mismatches:
            say(f"EXPECTATION NOT MET: {line}", err=True)
    if state.status == "awaiting_human":
        return AWAITING_HUMAN
    if scenario is not None and scenario.expect is not None:
        return FAILED if mismatches else OK
    return OK if state.status == "completed" else FAILED


# --- reading ------------------------------------------------------------------------------------
async def cmd_status(args: argparse.Namespace) -> int:
    async with connected() as client:
        state = await client.state(args.run_id)
        waiting = await _rate_limit_wait(client, args.run_id) if state is not None and not state.done else None
    if state is None:
        raise UserError(f"no run {args.run_id}", FAILED)
    summary = _summary(state)
    summary["rate_limit_wait"] = waiting.detail.model_dump(mode="json") if waiting is not None else None
    if args.json:
        emit_json(summary)
        return OK
    u = state.usage
    say(f"run:         {state.run_id}")
    say(f"status:      {state.status}" + (f" ({state.final_reason})" if state.final_reason else ""))
    say(f"priority:    {state.priority}" + (f" (tenant {state.tenant})" if state.tenant else ""))
    if state.status == "queued":
        say("waiting:     for its tenant's share of the fleet (`loopwarden fleet`)")
    elif state.admitted_at is not None:
        say(f"waited:      {state.waited_s:.1f}s for its tenant's share of the fleet")
    if state.refusal is not None and state.refusal.quota is not None:
        r = state.refusal
        say(
            f"refused by:  quota {r.quota}, limit {r.limit:g}, current {r.current:g}"
            if r.limit is not None and r.current is not None
            else f"refused by:  quota {r.quota}"
        )
    say(f"iterations:  {state.iteration.n} (continues {state.continue_count}, retries {state.retry_count})")
    say(f"tokens:      in {u.input_tokens}, out {u.output_tokens}, cost ${u.cost_usd:.4f}")
    if state.first_draft_passed is not None:
        say(f"first draft: {'passed' if state.first_draft_passed else 'rejected'}")
    if state.passed is not None:
        say(f"judged:      {'passed' if state.passed else 'not passed'}")
    if state.awaiting is not None:
        say(f"waiting on:  escalation {state.awaiting.escalation_id} ({state.awaiting.kind})")
    if state.stall is not None:
        from loopwarden.runtree import stall_line

        say(f"stalled:     {plain(stall_line(state.stall.model_dump(mode='json')) or state.stall.reason)}")
    if waiting is not None:
        d = waiting.detail
        left = max(0.0, (d.until - datetime.now(UTC)).total_seconds())
        say(
            f"waiting on:  the rate limit of {d.provider} key {d.account} ({d.cause}), {left:.1f}s more "
            f"(until {d.until.astimezone():%H:%M:%S}, its {d.purpose} call)"
        )
    if state.rate_limited_s:
        say(f"rate limits: waited {state.rate_limited_s:.1f}s in total")
    for warning in state.warnings:
        say(f"warning:     {warning}")
    if state.final_output is not None:
        say(f"answer:\n{state.final_output}")
    return OK


async def cmd_events(args: argparse.Namespace) -> int:
    from loopwarden.progress import render

    if getattr(args, "full", False) and not args.json:
        from loopwarden.cli_runview import cmd_events_full

        return await cmd_events_full(args)
    async with connected() as client:
        events = await client.events(args.run_id)
    if not events:
        raise UserError(f"no events for run {args.run_id}", FAILED)
    for event in events:
        if args.json:
            say(json_text({"subject": event.subject, **event.payload}, ensure_ascii=False))
        else:
            line = render(event)
            if line:
                say(plain(line))
    return OK


def trace_id_of(traceparent: str | None) -> str | None:
    """The trace id of a W3C ``traceparent`` (``00-<32 hex>-<16 hex>-<2 hex>``)."""
    parts = (traceparent or "").split("-")
    return parts[1] if len(parts) == 4 and len(parts[1]) == 32 and set(parts[1]) != {"0"} else None


def _at(event: Any) -> Any:
    from datetime import datetime

    at = event.payload.get("at")
    try:
        return datetime.fromisoformat(at) if isinstance(at, str) else None
    except ValueError:
        return None


async def cmd_trace(args: argparse.Namespace) -> int:
    from loopwarden.progress import render

    cfg = settings()
    async with connected(cfg) as client:
        events = await client.events(args.run_id)
    if not events:
        raise UserError(f"no events for run {args.run_id}", FAILED)
    trace_id = next((t for e in events if (t := trace_id_of(e.headers.get("traceparent")))), None)
    stamps = [a for e in events if (a := _at(e)) is not None]
    start = min(stamps) if stamps else None
    rows = []
    for event in events:
        at = _at(event)
        offset = (at - start).total_seconds() if at is not None and start is not None else None
        rows.append({"t_s": offset, "subject": event.subject, "line": render(event)})
    link = f"{cfg.jaeger_url.rstrip('/')}/trace/{trace_id}" if trace_id else None
    if args.json:
        emit_json({"run_id": args.run_id, "trace_id": trace_id, "jaeger": link, "timeline": rows})
        return OK
    say(f"run:      {args.run_id}")
    say(f"trace id: {trace_id or 'none: tracing was off when it ran (set OTEL_EXPORTER_OTLP_ENDPOINT)'}")
    if link:
        say(f"jaeger:   {link}  (spans are there when the services export to OTEL_EXPORTER_OTLP_ENDPOINT)")
    for row in rows:
        t = f"{row['t_s']:8.3f}s" if row["t_s"] is not None else "        -"
        say(plain(f"{t}  {row['line'] or row['subject']}"))
    return OK


async def cmd_metrics(args: argparse.Namespace) -> int:
    async with connected() as client:
        metrics = await client.tool_metrics()
    if args.json:
        emit_json(metrics)
        return OK
    say(
        f"{'tool':16} {'outputs':>7} {'parse':>6} {'valid':>6} {'repair':>6} {'schema_x':>8} {'corrected':>9} "
        f"{'attempts':>8} {'retried':>7}"
    )
    for tool, m in metrics.items():
        say(
            f"{tool:16} {m['outputs']:7.0f} {m['parse_success_rate']:6.0%} {m['validation_pass_rate']:6.0%} "
            f"{m['repair_rate']:6.0%} {m['schema_failures']:8.0f} {m['correction_success_rate']:9.0%} "
            f"{m['attempts']:8.0f} {m['retried_attempts']:7.0f}"
        )
    return OK


async def cmd_dlq(args: argparse.Namespace) -> int:
    async with connected() as client:  # as LW_NATS_USER: an operator reads the letters they may hand back
        letters = await client.letters()
    if args.json:
        emit_json([{"seq": n.seq, **n.letter.model_dump(mode="json")} for n in letters])
        return OK
    for n in letters:
        letter = n.letter
        again = f" (requeued letter {letter.requeued_from})" if letter.requeued_from is not None else ""
        say(f"{n.seq:>5}  {letter.at:%H:%M:%S} {letter.service:10} {letter.subject}: {letter.reason}{again}")
    if letters:
        say("(`loopwarden dlq requeue N` hands letter N back to its service)")
    return OK


def letter_number(value: str) -> int:
    """A letter's number as typed, or a UserError."""
    digits = value.strip()
    if not digits.isdigit() or int(digits) < 1:
        raise UserError(f"{value!r} is not a letter's number (`loopwarden dlq` lists them)")
    return int(digits)


async def cmd_requeue(args: argparse.Namespace) -> int:
    from nats.errors import TimeoutError as NatsTimeoutError

    from shared.dead_letters import NoSuchLetter, NotRequeueable

    seqs = list(dict.fromkeys(letter_number(v) for v in args.seqs))  # before connecting
    cfg = settings()
    user = cfg.nats_user or "client"
    async with connected(cfg) as client:
        try:  # every letter checked before any is handed back
            letters = [await client.requeueable(seq) for seq in seqs]
        except (NoSuchLetter, NotRequeueable) as err:
            raise UserError(f"{err}; nothing was requeued" if len(seqs) > 1 else str(err), FAILED) from None
        for seq, letter in zip(seqs, letters, strict=True):
            try:
                r = await client.requeue(seq, letter)
            except (NatsTimeoutError, TimeoutError):  # no PubAck in time
                raise UserError(
                    f"letter {seq}: no answer to the requeue on {letter.requeue_to} (LW_NATS_USER is {user})", FAILED
                ) from None
            except NotRequeueable as err:  # the server stored nothing: said, never "sent before"
                raise UserError(str(err), FAILED) from None
            say(f"letter {r.seq} handed back to {r.service} ({r.subject})")
    return OK
