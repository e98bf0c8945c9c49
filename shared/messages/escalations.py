"""The human queue's contracts: raising an escalation, the queue item, its events, requests and resolution."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field
from typing_extensions import TypedDict

from shared.escalation_actions import EscalationAction, EscalationKind, SlaAction
from shared.failures import FailureType
from shared.messages.conversation import ChatMessage
from shared.messages.tools import ToolOutcome
from shared.messages.wire import CallId, EscalationId, Name, RunId, Wire, utcnow


def escalation_id_for_call(run_id: str, iteration: int, call_id: str) -> str:
    """The planner and the escalation service both derive a tool failure's escalation id from it
    (scoped to the iteration: a scripted model may reuse a call id in a later turn)."""
    raw = f"esc-{run_id}-i{iteration}-{call_id}"
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in raw)


class EscalationDetails(TypedDict, total=False):
    """What the raiser knows that a person needs to act; each key is set only when it applies."""

    arguments: Any  # a call's arguments (tool escalations)
    error: str | None  # the error the model read for the call
    failure_type: FailureType | None  # which failure (a schema_cap: which contract broke)
    attempts: int  # how often the executor tried
    candidate: str  # not_judged: the candidate answer (its first 2,000 characters)
    score: float  # not_judged: the judge's score, when it gave one
    threshold: float  # not_judged: the passing score
    child_run_id: str  # spawn: the sub-agent's run
    estimated_cost_usd: float
    cost_ceiling_usd: float | None
    max_iterations: int | None
    tools: list[str] | None
    letter: int  # stalled: the dead letter (its LW_DLQ number) the run waits on
    service: str  # stalled: the service that gave up on it
    subject: str  # stalled: the dead-lettered message's subject


class EscalationRaise(Wire):
    """What a raiser files. It carries what the queue needs of the run (its tenant), so the escalation service
    never reads the planner's record of the run (``lw_runs``) or its conversation (``lw_history``)."""

    escalation_id: EscalationId
    run_id: RunId
    kind: EscalationKind
    reason: str
    tool: Name | None = None
    call_id: CallId | None = None
    details: EscalationDetails = Field(default_factory=lambda: EscalationDetails())
    tenant: Name | None = Field(None, description="the tenant of the item's run, as the raiser knows it")


class Escalation(EscalationRaise):
    status: Literal["open", "claimed", "resolved"] = "open"
    created_at: datetime = Field(default_factory=utcnow)
    claimed_by: Name | None = None
    resolution: EscalationResolution | None = None
    traceparent: str | None = None
    claimed_via: str | None = Field(None, description="the service that claimed on the operator's behalf (console)")
    lease_expires_at: datetime | None = Field(None, description="a claim not renewed by then returns to the queue")
    sla_deadline: datetime | None = Field(None, description="when the SLA's default action is applied")
    sla_action: SlaAction | None = None
    allowed_actions: list[EscalationAction] = Field(default_factory=list)
    context: list[ChatMessage] = Field(
        default_factory=list,
        description="the run's last turns, as a reader shows the item: read from the run's conversation when "
        "shown (`Client.show`); the queue stores none (an item stored by a 0.31 service may still hold its copy)",
    )
    trail: list[EscalationEvent] = Field(default_factory=list, description="claims, renewals, expiries, refusals")


class EscalationResolution(Wire):
    escalation_id: EscalationId
    run_id: RunId
    action: EscalationAction
    note: str = ""
    result: Any = None
    resolved_by: Name
    resolved_at: datetime = Field(default_factory=utcnow)
    via: str | None = Field(None, description="the service that acted on resolved_by's behalf (console)")
    by_sla: bool = Field(False, description="taken by the SLA when its deadline passed, not by a person")


EscalationEventKind = Literal["claimed", "renewed", "expired", "released", "refused", "sla_applied", "resolved"]


class EscalationEvent(Wire):
    """Something that happened to a queue item (``lw.v1.evt.escalation.<kind>``); identities are the
    ones the server enforced (taken from the request subject), never a payload field."""

    escalation_id: EscalationId
    run_id: str = Field("", max_length=64)
    kind: EscalationEventKind
    operator: Name | None = None
    via: str | None = None
    action: str | None = None
    reason: str = ""
    lease_expires_at: datetime | None = None
    at: datetime = Field(default_factory=utcnow)


class EscalationWithdraw(Wire):
    """The raiser no longer needs a human for an item (``lw.v1.cmd.escalation.withdraw``): the planner took the
    known result of a call it had escalated as ``unknown_outcome``, or a stalled run moved on. The service closes
    the item as resolved by the system, unless a person resolved it first (their resolution stands)."""

    escalation_id: EscalationId
    run_id: RunId
    reason: str = Field(description="why no human is needed any more (the item's trail shows it)")
    unknown: ToolOutcome | None = Field(
        None,
        description="the unknown_outcome failure the item is raised for: filed already closed if it is not queued yet",
    )
    raised: EscalationRaise | None = Field(
        None, description="the item as the planner raised it (a stalled run's): filed closed if not queued yet"
    )


class EscalationQuery(Wire):
    status: Literal["open", "claimed", "resolved", "all"] = "open"
    run_id: RunId | None = None
    kind: str | None = Field(None, max_length=64)
    tool: Name | None = None
    older_than_s: float | None = Field(None, ge=0, description="only items raised at least this long ago")
    newer_than_s: float | None = Field(None, ge=0, description="only items raised at most this long ago")
    escalation_id: EscalationId | None = Field(None, description="show one item (lw.v1.rpc.escalation.show)")


class EscalationClaim(Wire):
    """Claim (or renew) an item. Who claims is the operator token of the request subject."""

    escalation_id: EscalationId
    who: str | None = Field(
        None, max_length=64, description="ignored: identity comes from the subject the server allowed"
    )


class EscalationResolve(Wire):
    escalation_id: EscalationId
    who: str | None = Field(
        None, max_length=64, description="ignored: identity comes from the subject the server allowed"
    )
    action: EscalationAction
    note: str = ""
    result: Any = None


class EscalationReply(Wire):
    ok: bool
    error: str | None = None
    escalations: list[Escalation] = Field(default_factory=list)
    unreadable: list[str] = Field(default_factory=list, description="keys in lw_escalations that failed to parse")


Escalation.model_rebuild()
