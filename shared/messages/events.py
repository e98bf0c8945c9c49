"""Run events: one contract per kind, discriminated on ``kind`` (``RunEvent``)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field, RootModel

from shared.escalation_actions import EscalationAction, EscalationKind
from shared.failures import FailureType
from shared.messages.budget import BudgetDecision
from shared.messages.conversation import Usage
from shared.messages.runs import FinalStatus, Refusal, RunStatus
from shared.messages.wire import CallId, EscalationId, Name, RunId, Wire, utcnow

# Every event keeps the same head (run, iteration, status, a one-line summary for people, time)
# and carries what it reports as typed fields in ``detail``: readers read fields, never the summary.


class RunEventHead(Wire):
    run_id: RunId
    iteration: int = 0
    status: RunStatus = "running"
    summary: str = ""
    at: datetime = Field(default_factory=utcnow)


class NoDetail(Wire):
    pass


class StartedDetail(Wire):
    task: str = ""
    lessons: int = 0
    warnings: list[str] = Field(default_factory=list)
    answer_mode: Literal["auto", "submit", "text"] = "auto"
    waited_s: float = Field(0.0, description="how long the run waited for its tenant's share of the fleet (queued)")
    priority: int = 5


class QueuedDetail(Wire):
    priority: int = 5
    tenant: str = ""


class Queued(RunEventHead):
    """The submit was accepted and the run waits for its tenant's share of the fleet (``run.queued``); its
    ``run.started`` follows once it is admitted."""

    kind: Literal["queued"] = "queued"
    detail: QueuedDetail


class Started(RunEventHead):
    kind: Literal["started"] = "started"
    detail: StartedDetail


class CallDetail(Wire):
    tool: Name
    call_id: CallId


class RequestedCall(CallDetail):
    arguments: str = Field("", description="the call's arguments as JSON, cut to 160 characters")


class ModelCalledDetail(Wire):
    input_tokens: int
    output_tokens: int
    cost_usd: float
    model: str
    tool_calls: int = 0
    chars: int = 0
    cache_read_input_tokens: int = Field(0, description="part of input_tokens read from the prompt cache")
    cache_creation_input_tokens: int = Field(0, description="part of input_tokens written to the prompt cache")
    wrap_up: bool = Field(False, description="the run's last, tool-less turn")
    system_sha256: str | None = Field(
        None,
        description="sha256 of the system prompt the turn was sent, when it differs from the run's last turn that "
        "names one (None: that one's; its text: `system` on the turn that first names it)",
    )
    system: str | None = Field(
        None, description="the system prompt's text, on the turn whose `system_sha256` first names it only"
    )
    tools_offered: list[str] | None = Field(
        None,
        description="the names of the tools the turn offered the model, when they differ from the run's last turn "
        "that names them (None: those)",
    )
    rate_limit_wait_s: float = Field(0.0, description="how long the turn waited for its provider key's rate limit")
    calls: list[RequestedCall] = Field(
        default_factory=list,
        description="the tool calls the model made: each is dispatched to its tool (no event of its own), "
        "or blocked or delegated (with its own event)",
    )


class ModelCalled(RunEventHead):
    kind: Literal["model_called"] = "model_called"
    detail: ModelCalledDetail


class RateLimitedDetail(Wire):
    provider: str = Field(max_length=64)
    account: str = Field(
        max_length=64, description="the provider key, as the fleet names it: a short hash of its endpoint and key"
    )
    purpose: Literal["plan", "summarize", "judge"]
    wait_s: float = Field(ge=0, description="how long the call waits from now")
    until: datetime = Field(description="when it is sent")
    reason: Literal["capacity", "paused", "first_contact"] = Field(
        description="capacity: the key's pace across the fleet; paused: a 429 paused the key until its retry-after; "
        "first_contact: the key's limits are being learned by its first call"
    )
    dimension: Literal["requests", "input_tokens", "output_tokens", "tokens"] | None = Field(
        None, description="the limit that sets the pace (capacity)"
    )

    @property
    def cause(self) -> str:
        """Why, in a few words: the limit that sets the pace, a 429's pause, or a key's limits being learned."""
        if self.reason == "paused":
            return "paused by a 429"
        return "learning its limits" if self.reason == "first_contact" else (self.dimension or "its pace")


class RateLimited(RunEventHead):
    """A model call of the run waits for its provider key's rate limit, shared by every replica (no delivery
    is spent waiting; docs/rate-limits.md)."""

    kind: Literal["rate_limited"] = "rate_limited"
    detail: RateLimitedDetail


class ModelStoppedDetail(Wire):
    stop_reason: str = Field(description="max_tokens, refusal, context_window_exceeded or unknown_stop_reason")
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0


class ModelStopped(RunEventHead):
    """The model stopped without a usable turn (billed all the same); the run ends typed."""

    kind: Literal["model_stopped"] = "model_stopped"
    detail: ModelStoppedDetail


class DelegatedDetail(Wire):
    tool: Name = "delegate"
    call_id: CallId
    child_run_id: RunId
    estimated_cost_usd: float = 0.0
    cost_ceiling_usd: float | None = None
    depth: int = 1


class Delegated(RunEventHead):
    """A sub-agent run was started for a ``delegate`` call."""

    kind: Literal["delegated"] = "delegated"
    detail: DelegatedDetail


class SimulatedCall(RunEventHead):
    """The model wrote a tool call as text instead of making it."""

    kind: Literal["simulated_call"] = "simulated_call"
    detail: NoDetail = Field(default_factory=NoDetail)


class ToolBlocked(RunEventHead):
    """A call to a tool the run does not offer: answered with the list of tools, not executed."""

    kind: Literal["tool_blocked"] = "tool_blocked"
    detail: CallDetail


class ToolDispatched(RunEventHead):
    """No longer published: the calls are in ``run.model_called`` (``detail.calls``). Read in older
    streams."""

    kind: Literal["tool_dispatched"] = "tool_dispatched"
    detail: CallDetail


class ToolSucceededDetail(CallDetail):
    repaired: bool = False
    cached: bool = False
    fallback: str | None = None


class ToolSucceeded(RunEventHead):
    """No longer published: the validator's ``tool.succeeded.<tool>.<run>`` says it. Read in older
    streams."""

    kind: Literal["tool_succeeded"] = "tool_succeeded"
    detail: ToolSucceededDetail


class ToolFailedDetail(CallDetail):
    failure_type: FailureType
    error: str = ""


class ToolFailed(RunEventHead):
    kind: Literal["tool_failed"] = "tool_failed"
    detail: ToolFailedDetail


class CorrectedDetail(Wire):
    tool: str
    after: int = Field(description="schema failures in the streak the model corrected")


class Corrected(RunEventHead):
    kind: Literal["corrected"] = "corrected"
    detail: CorrectedDetail


class CandidateDetail(Wire):
    candidate_id: CallId


class JudgeRequested(RunEventHead):
    kind: Literal["judge_requested"] = "judge_requested"
    detail: CandidateDetail


class JudgedDetail(CandidateDetail):
    status: Literal["passed", "failed", "not_judged"]
    score: float | None = None
    criteria: dict[str, float] = Field(default_factory=dict)


class Judged(RunEventHead):
    kind: Literal["judged"] = "judged"
    detail: JudgedDetail


class VerdictIgnored(RunEventHead):
    """A verdict for a candidate that is no longer the current one."""

    kind: Literal["verdict_ignored"] = "verdict_ignored"
    detail: CandidateDetail


class DecidedDetail(Wire):
    action: Literal["complete", "continue", "retry"]
    row: int = Field(description="the row of the Decide table that matched")


class Decided(RunEventHead):
    kind: Literal["decided"] = "decided"
    detail: DecidedDetail


class EscalatedDetail(Wire):
    escalation_id: EscalationId
    kind: EscalationKind


class Escalated(RunEventHead):
    kind: Literal["escalated"] = "escalated"
    detail: EscalatedDetail


class ResumedDetail(Wire):
    escalation_id: EscalationId
    action: EscalationAction


class Resumed(RunEventHead):
    kind: Literal["resumed"] = "resumed"
    detail: ResumedDetail


class StalledDetail(Wire):
    reason: str = Field(max_length=2000)
    letter: int | None = Field(None, description="the dead letter (LW_DLQ number) the run waits on")
    service: str | None = Field(None, max_length=64, description="who dead-lettered it, or the service missing")
    subject: str | None = Field(None, max_length=512, description="the dead-lettered message's subject")
    escalation_id: EscalationId | None = Field(None, description="the queue item raised for it")


class Stalled(RunEventHead):
    """The run stopped moving: a message of it was dead-lettered, or a service it needs has no live replica.
    Not final: a requeue of the letter, a person (the queue item) or the replica coming back moves it on."""

    kind: Literal["stalled"] = "stalled"
    detail: StalledDetail


class FinishedDetail(Wire):
    final_output: str = ""
    submitted: bool = False
    passed: bool | None = None
    first_draft_passed: bool | None = Field(None, description="None: the first draft was not judged")
    iterations: int = 0
    continues: int = 0
    retries: int = 0
    usage: Usage = Field(default_factory=lambda: Usage())
    refusal: Refusal | None = Field(None, description="kind refused, at the door: the quota, its limit, the figure")


class RunFinished(RunEventHead):
    """The run's last event; ``kind`` is its final status."""

    kind: FinalStatus
    detail: FinishedDetail


class LoopDetail(Wire):
    pattern: Literal["identical", "alternating", "repeated_error"]
    call_id: CallId | None = None
    reflections: int = 0


class LoopDetected(RunEventHead):
    """On ``failure.loop``: the model repeats itself (the summary is the reflection it was given)."""

    kind: Literal["loop"] = "loop"
    detail: LoopDetail


class ReasonDetail(Wire):
    reason: str


class Unstalled(RunEventHead):
    """The run moves again (its letter was handed back and handled, or the work it waited on moved)."""

    kind: Literal["unstalled"] = "unstalled"
    detail: ReasonDetail


class GuardTripped(RunEventHead):
    """On ``failure.budget``: a guard (budget block, cost ceiling) stopped the iteration."""

    kind: Literal["guard.budget", "guard.cost"]
    detail: ReasonDetail


class NotJudgedDetail(CandidateDetail):
    reason: str = ""


class NotJudged(RunEventHead):
    """On ``failure.judge``: the judge could not score a candidate."""

    kind: Literal["not_judged"] = "not_judged"
    detail: NotJudgedDetail


BudgetThresholdKind = Literal["budget.warn", "budget.compact", "budget.block", "budget.fallback", "budget.wrap_up"]


class BudgetThreshold(RunEventHead):
    """On ``evt.budget.<level>``: a budget threshold fired for the first time (the governor)."""

    kind: BudgetThresholdKind
    detail: BudgetDecision


AnyRunEvent = Annotated[
    Started
    | ModelCalled
    | SimulatedCall
    | ToolBlocked
    | ToolDispatched
    | ToolSucceeded
    | ToolFailed
    | Corrected
    | JudgeRequested
    | Judged
    | VerdictIgnored
    | Decided
    | Escalated
    | Resumed
    | RunFinished
    | LoopDetected
    | GuardTripped
    | NotJudged
    | BudgetThreshold
    | ModelStopped
    | Delegated
    | Stalled
    | Unstalled
    | RateLimited
    | Queued,
    Field(discriminator="kind"),
]


# Events that never change a run's status: a change always comes with its own event (started,
# escalated, resumed, the final event, a guard, a loop). A waiter reads the run again on the others only.
PROGRESS_EVENTS: tuple[type[RunEventHead], ...] = (
    ModelCalled,
    SimulatedCall,
    ToolBlocked,
    ToolDispatched,
    ToolSucceeded,
    ToolFailed,
    Corrected,
    JudgeRequested,
    Judged,
    VerdictIgnored,
    Decided,
    Delegated,
    RateLimited,
)


class RunEvent(RootModel[AnyRunEvent]):
    """Any run event (``RunEvent.model_validate_json(data).root`` is the typed event)."""
