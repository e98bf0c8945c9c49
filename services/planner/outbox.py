"""What every phase of the run writes: the outbox of messages to publish, and the two ways a run
stops moving on its own (it finishes, or it waits for a human).

No bus and no I/O here: handlers load the state, call one ``apply_*`` function of a phase module
(``turns``, ``outcomes``, ``judging``, ``escalations``), remember the message as applied (with
what it produced), save the state with compare-and-swap, then publish what it returned (with
deterministic message ids, so a re-publish after a crash is absorbed by JetStream de-duplication).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from typing_extensions import Unpack

from services.planner import ids
from services.planner.state import Awaiting, PublishRecord, RunState
from shared import subjects as S
from shared.messages import (
    AnyRunEvent,
    Candidate,
    Escalated,
    EscalatedDetail,
    EscalationDetails,
    EscalationKind,
    EscalationRaise,
    EscalationWithdraw,
    FinalStatus,
    FinishedDetail,
    RunAdvance,
    RunFinished,
    ToolOutcome,
)


@dataclass
class Outbox:
    """Messages a transition wants published, in order."""

    state: RunState
    items: list[PublishRecord] = field(default_factory=list)

    def add(self, subject: str, payload: BaseModel, msg_id: str, run_id: str | None = None) -> None:
        self.items.append(PublishRecord.of(subject, payload, msg_id, run_id))

    def head(self, summary: str) -> dict[str, Any]:
        """The fields every run event starts with, as the run is now."""
        s = self.state
        return {"run_id": s.run_id, "iteration": s.iteration.n, "status": s.status, "summary": summary}

    def event(self, event: AnyRunEvent) -> None:
        """Publish a run event on ``run.<kind>``; its id is unique in the run (a counter in the state)."""
        s = self.state
        s.events_published += 1
        self.add(S.run_event(event.kind), event, ids.event(s.run_id, event.kind, s.iteration.n, s.events_published))


def advance(out: Outbox) -> None:
    """Ask for the next model turn of the current iteration."""
    s = out.state
    out.add(S.RUN_ADVANCE, RunAdvance(run_id=s.run_id, iteration=s.iteration.n), ids.advance(s.run_id, s.iteration.n))


def finish(
    out: Outbox, status: FinalStatus, reason: str, passed: bool | None = None, accepted: Candidate | None = None
) -> None:
    s = out.state
    s.status = status
    s.final_reason = reason
    s.passed = passed
    s.final_output = final_output(s, accepted)
    out.event(
        RunFinished(
            **out.head(f"{status}: {reason}"),
            kind=status,
            detail=FinishedDetail(
                final_output=s.final_output,
                submitted=s.submitted,
                passed=passed,
                first_draft_passed=s.first_draft_passed,
                iterations=s.iteration.n,
                continues=s.continue_count,
                retries=s.retry_count,
                usage=s.usage,
                refusal=s.refusal,
            ),
        )
    )
    if s.config.parent_run_id and s.config.parent_call_id:
        answer_parent(out)


def answer_parent(out: Outbox) -> None:
    """A sub-agent run ended: its final output is the parent's ``delegate`` result, with its usage."""
    s, cfg = out.state, out.state.config
    assert cfg.parent_run_id is not None and cfg.parent_call_id is not None
    common: dict[str, Any] = {
        "run_id": cfg.parent_run_id,
        "iteration": max(1, cfg.parent_iteration),
        "call_id": cfg.parent_call_id,
        "attempt_id": s.run_id,
        "tool": "delegate",
        "requested_tool": "delegate",
        "attempts": 0,  # no tool attempt ran: a sub-agent answered
        "usage": s.usage,
        "tenant": s.tenant,  # a sub-agent runs for its parent's tenant
    }
    if s.status == "completed" and (s.final_output or "").strip():
        outcome = ToolOutcome(success=True, data=s.final_output, **common)
        subject = S.tool_succeeded("delegate")
    else:
        last = f" Its last output: {s.final_output}" if (s.final_output or "").strip() else ""
        outcome = ToolOutcome(
            success=False,
            failure_type="tool_error",
            error=f"The sub-agent {s.run_id} {s.status}: {s.final_reason}.{last}",
            **common,
        )
        subject = S.failure("tool_error", "delegate")
    out.add(subject, outcome, ids.answer_to_parent(s.run_id, cfg.parent_call_id), run_id=cfg.parent_run_id)


def final_output(s: RunState, accepted: Candidate | None) -> str:
    """Never empty when something was produced: the accepted candidate, else the last
    non-empty answer, else the last non-empty text, else the last submitted payload."""
    if accepted is not None and accepted.content.strip():
        return accepted.content
    if s.last_answer.strip():
        return s.last_answer
    if s.last_text.strip():
        return s.last_text
    if s.last_submission:
        return submission_text(s.last_submission)
    return ""


def submission_text(payload: dict[str, Any]) -> str:
    """The submitted answer as text: the ``answer`` field, then any other fields labelled."""
    answer = payload.get("answer")
    if not isinstance(answer, str):
        return json.dumps(payload, ensure_ascii=False)
    rest = []
    for key, value in payload.items():
        if key == "answer":
            continue
        shown = "\n".join(f"- {v}" for v in value) if isinstance(value, list) else json.dumps(value, ensure_ascii=False)
        rest.append(f"{key.capitalize()}:\n{shown}" if isinstance(value, list) else f"{key.capitalize()}: {shown}")
    return "\n\n".join([answer, *rest])


# --- waiting for a human ----------------------------------------------------------------------


def await_human(out: Outbox, escalation_id: str, kind: EscalationKind, reason: str, call_id: str | None) -> None:
    """The run waits for a human on ``escalation_id`` (raised here or by the escalation service)."""
    s = out.state
    s.status = "awaiting_human"
    s.awaiting = Awaiting(escalation_id=escalation_id, kind=kind, call_id=call_id, reason=reason)
    out.event(
        Escalated(
            **out.head(f"waiting for a human ({kind}): {reason[:200]}"),
            detail=EscalatedDetail(escalation_id=escalation_id, kind=kind),
        )
    )


def escalate(
    out: Outbox,
    escalation_id: str,
    kind: EscalationKind,
    reason: str,
    tool: str | None,
    call_id: str | None,
    **details: Unpack[EscalationDetails],
) -> None:
    """Raise an escalation and wait for its resolution. An escalation about a call carries what a person
    needs to act on it (its arguments, the error the model read, the failure) unless the caller said."""
    s = out.state
    call = next((c for c in s.iteration.tool_calls if c.call_id == call_id), None) if call_id else None
    if call is not None:
        details.setdefault("arguments", call.arguments)
        if call.result_text:
            details.setdefault("error", call.result_text)
        if call.outcome is not None and call.outcome.failure_type:
            details.setdefault("failure_type", call.outcome.failure_type)
    out.add(
        S.ESCALATION_RAISE,
        EscalationRaise(
            escalation_id=escalation_id,
            run_id=s.run_id,
            kind=kind,
            reason=reason,
            tool=tool,
            call_id=call_id,
            details=details,
            tenant=s.tenant,  # whose item it is (the escalation service reads no run record)
        ),
        ids.escalation_raise(s.run_id, escalation_id),
    )
    await_human(out, escalation_id, kind, reason, call_id)


def withdraw(out: Outbox, escalation_id: str, unknown: ToolOutcome, reason: str) -> None:
    """The run no longer waits on ``escalation_id`` (the call's result became known): the escalation service
    closes the item as resolved by the system, unless a person resolved it first. ``unknown`` is the failure
    the item is raised for, so an item not queued yet is filed closed."""
    s = out.state
    out.add(
        S.ESCALATION_WITHDRAW,
        EscalationWithdraw(escalation_id=escalation_id, run_id=s.run_id, reason=reason, unknown=unknown),
        ids.escalation_withdraw(s.run_id, escalation_id),
    )
