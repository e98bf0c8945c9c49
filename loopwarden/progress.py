"""One line per event: what a person watching a run needs to see."""

from __future__ import annotations

from typing import assert_never

from pydantic import ValidationError

from loopwarden.client import Event
from loopwarden.queue_lines import escalation_detail
from shared.messages import (
    AnyRunEvent,
    BudgetThreshold,
    Corrected,
    Decided,
    Delegated,
    Escalated,
    GuardTripped,
    Judged,
    JudgeRequested,
    LoopDetected,
    ModelCalled,
    ModelStopped,
    NotJudged,
    Queued,
    RateLimited,
    Resumed,
    RunEvent,
    RunFinished,
    SimulatedCall,
    Stalled,
    Started,
    ToolAttempt,
    ToolBlocked,
    ToolDispatched,
    ToolFailed,
    ToolOutcome,
    ToolSucceeded,
    Unstalled,
    VerdictIgnored,
)


def render(e: Event) -> str | None:
    p = e.payload
    kind = e.kind
    if kind.startswith(("run.", "failure.loop", "budget.")):
        try:
            return run_line(RunEvent.model_validate(p).root)
        except ValidationError:  # a kind this version does not know (a newer writer): not shown
            return None
    tool = kind.split(".")[2] if kind.count(".") >= 2 else "?"
    if kind.startswith("tool.succeeded."):  # the validator's event (a sub-agent's answer to ``delegate`` too)
        try:
            o = ToolOutcome.model_validate(p)
        except ValidationError:  # e.g. a large result whose body could not be fetched: the subject says enough
            return f"       ✓ {tool} validated"
        output_repaired = len(o.repairs) > len(o.stripped) or (o.repaired and not o.stripped)
        extra = " (output repaired)" if output_repaired else ""
        extra += f" (undeclared input stripped: {', '.join(o.stripped)})" if o.stripped else ""
        extra += " (from cache)" if o.cached else ""
        extra += f" (fallback: {o.fallback_from.to_tool})" if o.fallback_from else ""
        return f"{iteration_tag(o.iteration)} ✓ {o.tool} validated{extra}"
    if kind.startswith("tool.attempt."):
        try:
            a = ToolAttempt.model_validate(p)
        except ValidationError:
            return f"       ↻ {tool}: an attempt failed"
        if a.ok:  # an older executor's event for the attempt that returned the output
            return None
        then = f", retrying in {a.next_delay_s:.2f}s" if a.next_delay_s is not None else ", no retries left"
        return f"       ↻ {a.tool} attempt {a.attempt} failed ({a.failure_type}: {a.error}){then}"
    if kind.startswith("escalation."):
        return f"       ⚑ escalation {kind.split('.')[-1]}: {escalation_detail(p)}"
    return None  # failures are shown through the run events


def iteration_tag(iteration: int) -> str:
    return f"[it {iteration}]" if iteration else "      "


def run_line(ev: AnyRunEvent) -> str | None:
    """The line for one run event, from its fields."""
    tag = iteration_tag(ev.iteration)
    match ev:
        case Started(detail=d):
            return f"▶ run started ({d.answer_mode} mode): {d.task}"
        case ModelCalled(detail=d):
            calls = "".join(f"\n{tag} → {c.tool}({c.arguments})" for c in d.calls)
            return (
                f"{tag} model: {d.tool_calls} tool call(s), {d.chars} chars · tokens in {d.input_tokens} "
                f"out {d.output_tokens} · ${d.cost_usd:.4f}{calls}"
            )
        case ToolDispatched():  # an older planner's event (the calls are in model_called now)
            return f"{tag} → {ev.summary}"
        case ToolSucceeded():  # an older planner's event: shown from the validator's tool.succeeded
            return None
        case ToolFailed():
            return f"{tag} ✗ {ev.summary}"
        case ToolBlocked():
            return f"{tag} ⊘ {ev.summary}"
        case Corrected() | JudgeRequested():
            return f"{tag} {'✓' if isinstance(ev, Corrected) else '⚖'} {ev.summary}"
        case Judged():
            return f"{tag} ⚖ verdict {ev.summary}"
        case Decided():
            return f"{tag} ⇒ decide {ev.summary}"
        case Escalated():
            return f"{tag} ⚑ {ev.summary}"
        case Resumed():
            return f"{tag} ↺ {ev.summary}"
        case RunFinished():
            return f"■ {ev.summary}"
        case SimulatedCall():
            return f"{tag} ! {ev.summary}"
        case LoopDetected():
            return f"{tag} ⟳ loop detected: {ev.summary[:120]}"
        case BudgetThreshold():
            return f"       $ budget {ev.kind.removeprefix('budget.')}: {ev.summary}"
        case ModelStopped(detail=d):
            return f"{tag} ■ model stopped ({d.stop_reason}): {ev.summary}"
        case Delegated(detail=d):
            return f"{tag} ⇢ sub-agent {d.child_run_id} (~${d.estimated_cost_usd:.4f})"
        case Stalled():
            return f"{tag} ‖ stalled: {ev.summary}"
        case Unstalled():
            return f"{tag} ▷ {ev.summary}"
        case RateLimited(detail=d):
            return (
                f"{tag} ⏳ waiting for the rate limit: {d.wait_s:.1f}s until {d.until.astimezone():%H:%M:%S} "
                f"({d.purpose} call, {d.provider} key {d.account}, {d.cause})"
            )
        case Queued(detail=d):
            return f"  ⧗ queued for tenant {d.tenant}'s share of the fleet (priority {d.priority})"
        case VerdictIgnored() | GuardTripped() | NotJudged():
            return None  # shown through the events that follow them
        case _:
            assert_never(ev)
