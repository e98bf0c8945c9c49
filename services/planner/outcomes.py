"""Tool outcomes: what a call's result does to the run.

A success feeds the model (and may end a schema-correction streak); a failure is routed by its
type and the tool's boundary: a schema error starts or continues a correction (a human past the
cap), a fatal or unknown outcome waits for a human, ``skip_and_note`` goes on without the tool,
``ask_human`` escalates. The same error again and again is a loop (``loops.react``).
"""

from __future__ import annotations

import re

from services.planner import context as C
from services.planner import ids, loops
from services.planner.delegation import DELEGATE, release
from services.planner.judging import finish_iteration
from services.planner.outbox import Outbox, await_human, escalate, withdraw
from services.planner.state import RunState, ToolCallRecord
from shared import subjects as S
from shared.failures import FAILURES, human_kind, replaceable
from shared.messages import (
    NAME_PATTERN,
    Corrected,
    CorrectedDetail,
    ToolFailed,
    ToolFailedDetail,
    ToolOutcome,
)


def answers(state: RunState, record: ToolCallRecord, outcome: ToolOutcome) -> bool:
    """Whether ``outcome`` is the outcome of the call ``record``: the same tool (a fallback keeps the tool
    the model asked for as ``requested_tool``) and, for ``delegate``, from the child run this run started
    for that call (a sub-agent answers with its own run id as the attempt)."""
    if outcome.requested_tool != record.tool:
        return False
    if record.tool == DELEGATE:
        return outcome.attempt_id == state.children.get(record.call_id)
    return True


KNOWN_AFTER_UNKNOWN = (
    "the call's result became known: the replica that ran it recorded it after another had declared it unknown"
)


def supersedes_unknown(state: RunState, record: ToolCallRecord, outcome: ToolOutcome) -> bool:
    """Whether ``outcome`` is a known outcome of the call the run waits on as an ``unknown_outcome``: the
    replica that ran it recorded its result after another replica had declared it unknown (the executor's
    ledger lets the known result win). Only then does a call take a second outcome; an unknown outcome after
    a known one is stale."""
    return (
        record.status == "awaiting_human"
        and record.outcome is not None
        and replaceable(record.outcome.failure_type)
        and not replaceable(outcome.failure_type)
        and outcome.attempt_id == record.outcome.attempt_id
        and state.awaiting is not None
        and state.awaiting.kind == human_kind(record.outcome.failure_type)
        and state.awaiting.call_id == record.call_id
    )


def apply_outcome(state: RunState, outcome: ToolOutcome) -> Outbox:
    out = Outbox(state)
    it = state.iteration
    record = next((c for c in it.tool_calls if c.call_id == outcome.call_id), None)
    if record is None or state.done:
        return out  # stale: nothing to do
    if not answers(state, record, outcome):
        return out  # not this call's outcome: another tool's, or a child this run never started
    if record.status != "dispatched":
        if not supersedes_unknown(state, record, outcome):
            return out  # a duplicate, or a later outcome of a call that has one: the first stands
        assert state.awaiting is not None and record.outcome is not None  # what supersedes_unknown checked
        # the result is known: no human needs to decide, and the queue item raised for the unknown closes
        withdraw(out, state.awaiting.escalation_id, record.outcome, KNOWN_AFTER_UNKNOWN)
        state.awaiting, state.status = None, "running"
    cfg = state.config
    record.outcome = outcome
    if record.tool == DELEGATE:
        release(state, record.call_id)  # its real spend replaces its grant in what a new sub-agent may have
    if outcome.usage is not None:  # a sub-agent's cost counts against this run's ceiling
        state.usage = state.usage + outcome.usage
        state.delegated_usage = state.delegated_usage + outcome.usage
    text, is_error = C.render_outcome(outcome, cfg.max_tool_result_tokens)
    record.result_text, record.is_error = text, is_error
    tool = outcome.requested_tool
    stats = state.corrections.setdefault(tool, {"failures": 0, "recovered": 0, "escalated": 0})

    if outcome.success:
        record.status = "succeeded"
        if state.schema_streak.get(tool, 0) > 0:
            stats["recovered"] += 1
            out.event(
                Corrected(
                    **out.head(f"{tool}: the model corrected a schema failure"),
                    detail=CorrectedDetail(tool=tool, after=state.schema_streak[tool]),
                )
            )
        state.schema_streak[tool] = 0
        if record.terminal:
            state.last_submission = dict(record.arguments)
        # no run event of its own: the validator's tool.succeeded.<tool>.<run> says it, with the output
    else:
        record.status = "failed"
        ftype = outcome.failure_type or "fatal"
        out.event(
            ToolFailed(
                **out.head(f"{outcome.tool} failed ({ftype}): {(outcome.error or '')[:160]}"),
                detail=ToolFailedDetail(
                    tool=outcome.tool, call_id=record.call_id, failure_type=ftype, error=outcome.error or ""
                ),
            )
        )
        state.error_history.append(loops.error_key(tool, outcome.error or ftype))
        rule = FAILURES[ftype]
        if rule.corrects:
            stats["failures"] += 1
            state.schema_streak[tool] = state.schema_streak.get(tool, 0) + 1
            if state.schema_streak[tool] > cfg.max_schema_corrections:
                stats["escalated"] += 1
                escalate(
                    out,
                    ids.schema_cap_escalation(state.run_id, it.n, record.call_id),
                    "schema_cap",
                    f"'{tool}' failed its contract {state.schema_streak[tool]} times in a row "
                    f"(cap {cfg.max_schema_corrections}): {outcome.error}",
                    tool,
                    record.call_id,
                    failure_type=ftype,  # which contract broke (input or output), not only that a cap was reached
                )
                record.status = "awaiting_human"
        elif rule.human is not None:
            # The escalation service raises these itself from its failure subscription.
            record.status = "awaiting_human"
            await_human(
                out,
                ids.call_escalation(state.run_id, it.n, record.call_id),
                rule.human,
                outcome.error or ftype,
                record.call_id,
            )
        elif rule.boundary and outcome.boundary == "skip_and_note":
            record.status = "skipped"
            record.is_error = False
            record.result_text = C.skipped_result(tool, outcome.error)
        elif rule.boundary and outcome.boundary == "ask_human":
            record.status = "awaiting_human"
            escalate(
                out,
                ids.call_escalation(state.run_id, it.n, record.call_id),
                "ask_human",
                f"'{tool}' failed and its boundary asks a human: {outcome.error}",
                tool,
                record.call_id,
            )
        finding = loops.check_errors(state.error_history, threshold=cfg.loop_repeat_threshold)
        if finding is not None and record.status == "failed":
            state.error_history.clear()
            it.notes.append(finding.reflection)  # the reflection closes this iteration's turn
            loops.react(out, finding, tool, record.call_id)
    if not it.pending and state.awaiting is None:
        finish_iteration(out)
    return out


def unknown_tool(out: Outbox, record: ToolCallRecord, available: list[str]) -> None:
    """A call to a tool no replica hosts (or the run does not offer): never dispatched. The model gets
    the ``unknown_tool`` failure with the tools it may call, the failure is published and counted like a
    contract failure (``failure.unknown_tool.<tool>``, the tool's correction streak), and past the
    correction cap the run escalates (``schema_cap`` with ``failure_type: unknown_tool``)."""
    state, it, cfg = out.state, out.state.iteration, out.state.config
    tool = record.tool
    error = C.unknown_tool(tool, available)
    record.status, record.result_text, record.is_error = "failed", error, True
    # a made-up name may be no valid tool name (a subject token): the wire carries it made safe
    label = tool if re.fullmatch(NAME_PATTERN, tool) else (re.sub(r"[^A-Za-z0-9_-]", "_", tool)[:64] or "_")
    out.event(
        ToolFailed(
            **out.head(f"{tool} failed (unknown_tool): no replica hosts it; the model may call {len(available)}"),
            detail=ToolFailedDetail(tool=label, call_id=record.call_id, failure_type="unknown_tool", error=error),
        )
    )
    out.add(
        S.failure("unknown_tool", label),
        ToolOutcome(
            run_id=state.run_id,
            iteration=it.n,
            call_id=record.call_id,
            attempt_id=ids.attempt(state.run_id, it.n, record.call_id),
            tool=label,
            requested_tool=label,
            arguments=record.arguments,
            success=False,
            error=error,
            failure_type="unknown_tool",
            attempts=0,
            tenant=state.tenant,
        ),
        ids.unknown_tool(state.run_id, it.n, record.call_id),
    )
    stats = state.corrections.setdefault(tool, {"failures": 0, "recovered": 0, "escalated": 0})
    stats["failures"] += 1
    state.schema_streak[tool] = state.schema_streak.get(tool, 0) + 1
    if state.schema_streak[tool] > cfg.max_schema_corrections:
        stats["escalated"] += 1
        escalate(
            out,
            ids.schema_cap_escalation(state.run_id, it.n, record.call_id),
            "schema_cap",
            f"'{tool}' was called {state.schema_streak[tool]} times in a row and no replica hosts it "
            f"(cap {cfg.max_schema_corrections}): {error}",
            label,
            record.call_id,
            failure_type="unknown_tool",
        )
        record.status = "awaiting_human"
