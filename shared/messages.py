"""Wire contracts: every message on the bus is one of these models.

Readers ignore unknown fields (``extra="ignore"``) so a newer writer may add optional
fields without breaking an older reader; a breaking change gets a new subject version.
JSON Schemas generated from these models live in ``schemas/messages/`` (drift-tested).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel, field_validator, model_validator
from typing_extensions import TypedDict

# The failure table's and the queue table's words, re-exported (``X as X``): callers import them from here.
from shared.escalation_actions import EscalationAction as EscalationAction
from shared.escalation_actions import EscalationKind as EscalationKind
from shared.escalation_actions import SlaAction as SlaAction
from shared.failures import CALL_FAILURES as CALL_FAILURES
from shared.failures import HUMAN_FAILURES as HUMAN_FAILURES
from shared.failures import PLANNER_FAILURES as PLANNER_FAILURES
from shared.failures import RETRIED_FAILURES as RETRIED_FAILURES
from shared.failures import SCHEMA_FAILURES as SCHEMA_FAILURES
from shared.failures import TOOL_FAILURES as TOOL_FAILURES
from shared.failures import FailureType as FailureType
from shared.failures import HumanFailure as HumanFailure
from shared.failures import needs_human as needs_human
from shared.providers import ProviderName

RUN_ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
# Every id in every contract is bounded and patterned: an id may end up in a subject, a message id or a KV
# key, and an over-long subject makes nats-server close the connection of whoever publishes it.
NAME_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"  # tool names, tenants, operators, services
CALL_ID_PATTERN = r"^[A-Za-z0-9_.:-]{1,128}$"  # a model's tool_use id, a candidate: never a subject token
ESCALATION_ID_PATTERN = r"^[A-Za-z0-9_-]{1,256}$"  # derived from a run, an iteration and a call or candidate
ATTEMPT_ID_PATTERN = r"^[A-Za-z0-9_=/.:-]{1,512}$"  # a KV key: <run>.i<n>.<call>[.fb.<tool>]..., or a child run
DIGEST_PATTERN = r"^[0-9a-f]{64}$"
TASK_MAX_CHARS = 100_000  # a run's task; a larger input travels as a tool's data, not as the prompt
RunId = Annotated[str, Field(pattern=RUN_ID_PATTERN)]
Name = Annotated[str, Field(pattern=NAME_PATTERN)]
CallId = Annotated[str, Field(pattern=CALL_ID_PATTERN)]
EscalationId = Annotated[str, Field(pattern=ESCALATION_ID_PATTERN)]
AttemptId = Annotated[str, Field(pattern=ATTEMPT_ID_PATTERN)]

Boundary = Literal["skip_and_note", "use_cached", "ask_human"]


def utcnow() -> datetime:
    return datetime.now(UTC)


class Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


# --- conversation -----------------------------------------------------------------------------


class TextBlock(Wire):
    type: Literal["text"] = "text"
    text: str


class ToolUseBlock(Wire):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(Wire):
    type: Literal["tool_result"] = "tool_result"
    tool_use_id: str
    content: str
    is_error: bool = False


Block = Annotated[TextBlock | ToolUseBlock | ToolResultBlock, Field(discriminator="type")]


class ChatMessage(Wire):
    role: Literal["user", "assistant"]
    content: list[Block]

    @classmethod
    def user(cls, text: str) -> ChatMessage:
        return cls(role="user", content=[TextBlock(text=text)])

    def text(self) -> str:
        return "".join(b.text for b in self.content if isinstance(b, TextBlock))


class Usage(Wire):
    input_tokens: int = Field(0, description="every prompt token, cached or not (the cache fields are parts of it)")
    output_tokens: int = 0
    cost_usd: float = 0.0
    cache_read_input_tokens: int = Field(0, description="prompt tokens read from the prompt cache (billed at 0.1x)")
    cache_creation_input_tokens: int = Field(0, description="prompt tokens written to the prompt cache (1.25x)")

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cost_usd=round(self.cost_usd + other.cost_usd, 8),
            cache_read_input_tokens=self.cache_read_input_tokens + other.cache_read_input_tokens,
            cache_creation_input_tokens=self.cache_creation_input_tokens + other.cache_creation_input_tokens,
        )


# --- rubric -----------------------------------------------------------------------------------

JudgeInput = Literal["task", "answer", "tool_history"]


class Criterion(Wire):
    name: str = Field(min_length=1, description="kept exactly as written, in any language")
    weight: float = Field(1.0, gt=0)
    hard: bool = Field(False, description="a failed hard criterion forces the score to 0")
    pass_at: float = Field(0.5, ge=0, le=1, description="a hard criterion fails below this score")
    description: str | None = None
    needs: list[JudgeInput] = Field(
        default_factory=list, description="what the judge must see to decide this criterion"
    )


class Rubric(Wire):
    criteria: list[Criterion] = Field(min_length=1)
    threshold: float = Field(0.8, ge=0, le=1)
    judge_sees: list[JudgeInput] = Field(default_factory=lambda: list[JudgeInput](["task", "answer"]))

    @field_validator("criteria")
    @classmethod
    def _unique(cls, v: list[Criterion]) -> list[Criterion]:
        names = [c.name for c in v]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"criterion names must be unique; repeated: {', '.join(dupes)}")
        return v


# --- runs -------------------------------------------------------------------------------------


class RunLimits(Wire):
    """Per-run overrides of the service defaults; ``None`` keeps the default."""

    max_iterations: int | None = Field(None, ge=1)
    max_judge_retries: int | None = Field(None, ge=0)
    max_schema_corrections: int | None = Field(None, ge=0)
    cost_ceiling_usd: float | None = Field(None, gt=0)
    run_token_budget: int | None = Field(None, ge=100)
    context_budget_tokens: int | None = Field(None, ge=100)
    not_judged_policy: Literal["escalate", "retry", "accept", "fail"] | None = None
    loop_policy: Literal["stop", "escalate"] | None = None
    loop_repeat_threshold: int | None = Field(None, ge=2)


class RunSubmit(Wire):
    run_id: RunId
    task: str = Field(min_length=1, max_length=TASK_MAX_CHARS)
    rubric: Rubric | None = None
    limits: RunLimits = Field(default_factory=RunLimits)
    answer_mode: Literal["auto", "submit", "text"] = Field(
        "auto",
        description="submit: only the terminal tool's payload is an answer; text: only a final text turn; "
        "auto: either (a text that merely describes a tool call is neither)",
    )
    terminal_tools: list[Name] = Field(default_factory=lambda: ["submit_result"], max_length=64)
    tools: list[Name] | None = Field(
        None, max_length=1024, description="allowlist of tools; None offers every registered tool"
    )
    lessons: bool = Field(False, description="start with the failure reasons of earlier runs of this task")
    submitted_at: datetime = Field(default_factory=utcnow)
    scenario: dict[str, Any] | None = Field(
        None,
        description="a scenario bound to the run at submit (only the planner stores it): its turns replace the "
        "model's and its tool behaviour the tools'",
    )
    scenario_digest: str | None = Field(
        None, pattern=DIGEST_PATTERN, description="sha256 of the scenario's canonical JSON"
    )
    tenant: Name | None = Field(
        None,
        description="who pays (the governor keeps a daily ceiling per tenant): the tenant of the submit subject "
        "(``cmd.run.submit.<tenant>``, which the server lets only that tenant's users publish); a body naming "
        "another is refused",
    )
    parent_run_id: RunId | None = Field(
        None, description="a sub-agent run: the run that delegated to it (only on cmd.run.spawn, the planner's)"
    )
    parent_call_id: CallId | None = Field(
        None, description="the parent's delegate call this run answers (only on cmd.run.spawn)"
    )
    parent_iteration: int = Field(0, ge=0, description="the parent's iteration that made the call (cmd.run.spawn)")
    depth: int = Field(
        0, ge=0, le=64, description="0 for a top-level run; a sub-agent is its parent's depth + 1 (cmd.run.spawn)"
    )
    agent: Name | None = Field(
        None,
        description="run a registered agent (``lw_agents``): the planner resolves its definition at submit; the "
        "submit's task (and scenario) stand, everything else is the agent's",
    )


AGENT_INSTRUCTIONS_MAX_CHARS = 20_000


class Agent(Wire):
    """An agent a user names and runs (``loopwarden agents register FILE``, ``client.register(agent)``):
    what every run of it gets. A run by name (``RunSubmit.agent``) brings its task (and a scenario, for a
    scripted run); the rest is the definition's, resolved by the planner at submit."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: Name
    description: str = Field("", max_length=2000)
    instructions: str = Field(
        "", max_length=AGENT_INSTRUCTIONS_MAX_CHARS, description="the agent's system prompt, ahead of the loop's rules"
    )
    provider: ProviderName | None = Field(
        None,
        description="the planner provider its live runs need: a planner configured otherwise refuses them "
        "(None: whatever the stack runs). A scripted run (with a scenario) is replayed either way",
    )
    model: str | None = Field(None, max_length=128, description="its runs' planner model")
    tools: list[Name] | None = Field(
        None, max_length=1024, description="tool allowlist (the terminal tools are offered too); None: every tool"
    )
    terminal_tools: list[Name] = Field(default_factory=lambda: ["submit_result"], max_length=64)
    answer_mode: Literal["auto", "submit", "text"] = "auto"
    rubric: Rubric | None = None
    limits: RunLimits = Field(default_factory=RunLimits)
    lessons: bool = False
    tenants: list[Name] | None = Field(
        None, max_length=1024, description="the tenants that may run it (None: every tenant)"
    )


class AgentRecord(Wire):
    """An agent as stored in ``lw_agents`` (key: its name): the definition, its version (1, 2, ... one
    more at each registration that changes it) and the digest of its canonical JSON."""

    agent: Agent
    version: int = Field(ge=1)
    digest: str = Field(pattern=DIGEST_PATTERN)
    registered_at: datetime = Field(default_factory=utcnow)


RunStatus = Literal["running", "awaiting_human", "completed", "stopped", "failed"]
FinalStatus = Literal["completed", "stopped", "failed"]
FINAL_STATUSES: tuple[FinalStatus, ...] = ("completed", "stopped", "failed")
"""A run in one of these statuses is over: nothing moves it again."""


class RunAdvance(Wire):
    """The command that asks the planner for the model turn of ``iteration``."""

    run_id: RunId
    iteration: int


# --- run events: one contract per kind, discriminated on ``kind`` --------------------------------
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
        None, description="sha256 of the system prompt the turn was sent (its text: `system` on the run's first turn)"
    )
    system: str | None = Field(
        None, description="the system prompt's text, on the run's first model turn only: later turns name its hash"
    )
    tools_offered: list[str] | None = Field(None, description="the names of the tools the turn offered the model")
    calls: list[RequestedCall] = Field(
        default_factory=list,
        description="the tool calls the model made: each is dispatched to its tool (no event of its own), "
        "or blocked or delegated (with its own event)",
    )


class ModelCalled(RunEventHead):
    kind: Literal["model_called"] = "model_called"
    detail: ModelCalledDetail


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


class FinishedDetail(Wire):
    final_output: str = ""
    submitted: bool = False
    passed: bool | None = None
    first_draft_passed: bool | None = Field(None, description="None: the first draft was not judged")
    iterations: int = 0
    continues: int = 0
    retries: int = 0
    usage: Usage = Field(default_factory=lambda: Usage())


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
    | Delegated,
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
)


class RunEvent(RootModel[AnyRunEvent]):
    """Any run event (``RunEvent.model_validate_json(data).root`` is the typed event)."""


# --- tools ------------------------------------------------------------------------------------


class RetryPolicy(Wire):
    max_attempts: int = Field(3, ge=1)
    base_delay_s: float = Field(0.2, ge=0)
    max_delay_s: float = Field(5.0, ge=0)
    max_elapsed_s: float = Field(30.0, gt=0)


class RepairRule(Wire):
    path: str = Field(description="JSON pointer to the field; '*' matches any array index or key")
    rule: str = Field(description="name of a registered repair, e.g. numeric_string_to_integer")


class ToolContract(Wire):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str = Field(min_length=1)
    input_schema: dict[str, Any] = Field(alias="inputSchema")
    output_schema: dict[str, Any] = Field(alias="outputSchema")
    idempotent: bool = False
    timeout_s: float = Field(10.0, gt=0)
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    fallback: str | None = Field(None, description="tool to use when this one fails recoverably")
    boundary: Boundary | None = Field(None, description="what to do when retries and fallbacks are spent")
    group: str | None = Field(None, description="a group of tools that share an error boundary (LW_BOUNDARIES)")
    terminal: bool = Field(False, description="a successful call ends the run's work (e.g. submit_result)")
    repairs: list[RepairRule] = Field(default_factory=list)
    source: Literal["python", "json", "mcp"] = "python"
    dialect: str | None = None
    fingerprint: str | None = None

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class ToolCall(Wire):
    """Command: execute one tool call (``lw.v1.cmd.tool.execute.<tool>``)."""

    run_id: RunId
    iteration: int = Field(ge=1)
    call_id: CallId
    attempt_id: AttemptId = Field(description="unique per execution, incl. fallbacks")
    tool: Name
    requested_tool: Name
    arguments: dict[str, Any]
    fallback_from: FallbackNote | None = None


class FallbackNote(Wire):
    from_tool: Name
    to_tool: Name
    reason: str


class SchemaError(Wire):
    path: str
    keyword: str
    message: str
    expected: Any = None
    got: Any = None


class ToolResultRaw(Wire):
    """Command: check a tool's output against its contract (``lw.v1.cmd.result.validate``)."""

    run_id: RunId
    iteration: int
    call_id: CallId
    attempt_id: AttemptId
    tool: Name
    requested_tool: Name
    arguments: dict[str, Any]
    output: Any = None
    output_is_text: bool = Field(False, description="output is raw text that must parse as JSON")
    attempts: int = 1
    duration_ms: float = 0.0
    cached: bool = False
    fallback_from: FallbackNote | None = None
    stripped: list[str] = Field(
        default_factory=list,
        description="JSON pointers of the undeclared input fields removed before the call ran (policy strip); "
        "`arguments` is what remains",
    )


class ToolOutcome(Wire):
    """Event: a tool call's final outcome, on ``tool.succeeded.<tool>`` or ``failure.<type>.<tool>``."""

    run_id: RunId
    iteration: int
    call_id: CallId
    attempt_id: AttemptId
    tool: Name
    requested_tool: Name
    arguments: dict[str, Any] = Field(default_factory=dict)
    success: bool
    error: str | None = Field(None, description="written for the model: what failed and what to do")
    recoverable: bool = True
    data: Any = None
    failure_type: FailureType | None = None
    errors: list[SchemaError] = Field(default_factory=list)
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    parsed: bool = True
    repaired: bool = False
    repairs: list[str] = Field(
        default_factory=list, description="what was repaired: the stripped input fields first, then the output's"
    )
    stripped: list[str] = Field(
        default_factory=list,
        description="JSON pointers of the undeclared input fields removed before the call ran (policy strip)",
    )
    attempts: int = 1
    cached: bool = False
    fallback_from: FallbackNote | None = None
    boundary: Boundary | None = None
    terminal: bool = False
    will_retry: bool = Field(
        False,
        description="a transient failure of one attempt after which the executor goes on with this call (another "
        "attempt, the fallback tool or the cached result): an event for subscribers, not the call's outcome",
    )
    effect: Literal["none", "took_effect", "may_have"] | None = Field(
        None, description="for a failed call of a non-idempotent tool: whether its side effect happened"
    )
    usage: Usage | None = Field(
        None, description="model usage the call caused (a sub-agent run's), rolled up into the calling run's"
    )

    @model_validator(mode="after")
    def _failure_has_type(self) -> ToolOutcome:
        if not self.success and self.failure_type is None:
            raise ValueError("a failed outcome needs a failure_type")
        if not self.success and not self.error:
            raise ValueError("a failed outcome needs a model-readable error")
        return self


def call_attempts(outcome_attempts: int, attempt_events: int) -> int:
    """How many attempts one tool call made: its final outcome counts them all (``attempts``); its
    ``tool.attempt`` events are the failed ones (and, from an earlier executor, the successful one
    too). A call with no final outcome yet (a fallback took over, or it is still running) has only
    its events to count."""
    return max(outcome_attempts, attempt_events)


class ToolAttempt(Wire):
    """Event: one execution attempt that failed (transient retries are visible here and in the trace).
    The attempt that returned output is told by the call's outcome: a call made as many attempts as
    its final outcome's ``attempts`` (``call_attempts``); an earlier executor published that attempt
    here too, with ``ok`` true."""

    run_id: RunId
    call_id: CallId
    attempt_id: AttemptId
    tool: Name
    attempt: int
    ok: bool
    failure_type: FailureType | None = None
    error: str | None = None
    next_delay_s: float | None = None


class CachedToolResult(Wire):
    """The last good (validated) result per (tool, arguments), for the ``use_cached`` boundary."""

    tool: Name
    data: Any
    at: datetime = Field(default_factory=utcnow)


# --- judge ------------------------------------------------------------------------------------


class Candidate(Wire):
    id: CallId
    iteration: int
    kind: Literal["text", "submission"]
    content: str
    payload: dict[str, Any] | None = None


class JudgeRequest(Wire):
    run_id: RunId
    candidate: Candidate
    task: str
    rubric: Rubric
    judged_before: int = Field(0, ge=0, description="candidates of this run sent to the judge before this one")
    tool_history: list[str] = Field(default_factory=list)


class CriterionScore(Wire):
    name: str
    score: float = Field(ge=0, le=1)
    weight: float
    hard: bool = False
    passed: bool = True
    reason: str = ""


class Verdict(Wire):
    run_id: RunId
    candidate_id: CallId
    iteration: int
    status: Literal["passed", "failed", "not_judged"]
    score: float | None = None
    threshold: float
    criteria: list[CriterionScore] = Field(default_factory=list)
    reasons: list[str] = Field(default_factory=list)
    not_judged_reason: str | None = None
    judge_model: str = ""
    usage: Usage = Field(default_factory=Usage)

    @model_validator(mode="after")
    def _no_score_when_not_judged(self) -> Verdict:
        if self.status == "not_judged" and (self.score is not None or not self.not_judged_reason):
            raise ValueError("a not_judged verdict carries a reason and no score")
        if self.status != "not_judged" and self.score is None:
            raise ValueError("a judged verdict carries a score")
        return self


# --- budget -----------------------------------------------------------------------------------


class SectionTokens(Wire):
    goal: int = 0
    history: int = 0
    tools: int = 0
    output: int = 0

    @property
    def total(self) -> int:
        return self.goal + self.history + self.tools + self.output


class BudgetRequest(Wire):
    run_id: RunId
    turn: int
    model: str = Field(max_length=128)
    sections: SectionTokens
    spent: Usage
    context_budget_tokens: int
    run_token_budget: int
    cost_ceiling_usd: float
    tenant: Name | None = None
    wrap_up: bool = Field(False, description="this turn is already the run's tool-less wrap-up turn")
    delegated_usd: float = Field(
        0.0, ge=0, description="the part of spent.cost_usd its sub-agents spent (each accounts its own to the tenant)"
    )


BudgetAction = Literal["allow", "warn", "compact", "block", "wrap_up"]


class BudgetDecision(Wire):
    run_id: RunId
    turn: int
    action: BudgetAction
    model: str
    max_output_tokens: int
    reasons: list[str] = Field(default_factory=list)
    fired: list[str] = Field(default_factory=list, description="thresholds that fired for the first time")
    allocations: dict[str, int] = Field(default_factory=dict)
    usage_ratio: float = 0.0
    calibration: float = Field(1.0, description="reported / estimated input tokens for this model, applied here")
    estimated_cost_usd: float = Field(0.0, description="what this call is expected to cost, at cache rates")


# --- escalation -------------------------------------------------------------------------------


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


class EscalationRaise(Wire):
    escalation_id: EscalationId
    run_id: RunId
    kind: EscalationKind
    reason: str
    tool: Name | None = None
    call_id: CallId | None = None
    details: EscalationDetails = Field(default_factory=lambda: EscalationDetails())


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
    context: list[ChatMessage] = Field(default_factory=list, description="the run's last turns when it was raised")
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


# --- dead letters -----------------------------------------------------------------------------


class DeadLetter(Wire):
    """A message a service gave up on (``lw.v1.dlq.<service>``), with the reason. Its number is its
    sequence in LW_DLQ (``loopwarden dlq`` shows it; ``loopwarden dlq requeue N`` hands it back)."""

    service: str
    subject: str
    reason: str
    body: str
    headers: dict[str, str] = Field(default_factory=dict)
    deliveries: int = Field(1, description="how often the message was delivered, its earlier requeues included")
    at: datetime = Field(default_factory=utcnow)
    requeued_from: int | None = Field(
        None, description="the number (LW_DLQ sequence) of the letter this message was requeued from"
    )
    requeue_to: str | None = Field(
        None,
        description="where `loopwarden dlq requeue` hands it back (the requeue subject of the consumer that took "
        "it); None: it was not taken from a durable consumer (a request) and cannot be handed back",
    )


class Requeue(Wire):
    """Command on a letter's ``requeue_to`` (``lw.v1.cmd.requeue.<service>[.<scope>]``): a dead letter
    handed back to the service that gave up on it. The command names the letter only: the service reads
    it from LW_DLQ itself, where only it (or the admin) can have written under its own dead-letter subject,
    and runs that message (subject, body, headers) through the consumer that takes it, as a redelivery.
    Whoever may requeue can hand back what the service gave up on, never make it run a message of their own."""

    letter: int = Field(ge=1, description="the letter's number (its LW_DLQ sequence)")


class ErrorReply(Wire):
    """The answer to a request a service could not serve (malformed, or its handler failed)."""

    ok: Literal[False] = False
    error: str


class McpServerStatus(Wire):
    """Event ``evt.mcp.server.<name>`` and the server's entry in ``lw_mcp_servers``: a mounted MCP
    server's state as the executor that runs it sees it."""

    server: str
    executor: str = Field(description="the executor process (host:pid) running this copy of the server")
    state: Literal["starting", "up", "failed", "down", "stopped"]
    detail: str = ""
    tools: list[str] = Field(default_factory=list, description="mounted tool names")
    refused: dict[str, str] = Field(default_factory=dict, description="tool -> why it was not mounted")
    restarts: int = 0
    next_start_in_s: float | None = None
    start_ms: float | None = Field(None, description="start-up (spawn, handshake, tool list) time")
    at: datetime = Field(default_factory=utcnow)


# --- a run as the planner publishes it ---------------------------------------------------------


class IterationView(Wire):
    n: int
    kind: Literal["work", "synthesis", "retry"] = "work"


class AwaitingView(Wire):
    escalation_id: EscalationId
    kind: str
    call_id: CallId | None = None
    reason: str = ""


class RunSnapshot(Wire):
    """A run as the planner publishes it: its record in ``lw_runs`` (key: the run id, rewritten with
    compare-and-swap at every step; readers ignore the planner's private fields). The record stays
    the same size however long the run: the conversation is in ``lw_history``, one key per message
    (``<run>.<seq>``, written once and never changed), and the record names the live part of it:
    messages ``history_start`` .. ``history_len - 1``, of which those from ``tail_from`` on are carried
    in ``tail`` (the planner writes them to ``lw_history`` after the record; a reader takes them from
    here). ``shared/history.py`` reads it; ``messages`` is filled by a reader that asked for the
    history and is never stored."""

    run_id: RunId
    task: str
    status: RunStatus = "running"
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)
    iteration: IterationView
    model: str = ""
    model_calls: int = 0
    continue_count: int = 0
    retry_count: int = 0
    judge_seq: int = Field(0, description="judge requests sent")
    usage: Usage = Field(default_factory=Usage)
    compactions: int = 0
    summary: str | None = None
    corrections: dict[str, dict[str, int]] = Field(default_factory=dict, description="per tool: failures, recovered")
    warnings: list[str] = Field(default_factory=list)
    submitted: bool = Field(False, description="a terminal tool executed successfully (tool-call history)")
    final_output: str | None = None
    final_reason: str | None = None
    agent: str | None = Field(None, description="the registered agent the run is of")
    agent_version: int | None = Field(None, description="the version of its definition the run used")
    tenant: str | None = Field(None, description="who pays: the tenant the run was submitted for")
    passed: bool | None = None
    first_draft_passed: bool | None = None
    awaiting: AwaitingView | None = None
    history_start: int = Field(0, description="seq of the first live message (older ones were compacted)")
    history_len: int = Field(0, description="seq after the last message")
    tail_from: int = Field(0, description="seq of tail[0]")
    tail: list[ChatMessage] = Field(default_factory=list, description="messages tail_from.. (newest)")
    messages: list[ChatMessage] = Field(
        default_factory=list, exclude=True, description="the live conversation, when read (never stored here)"
    )

    @property
    def done(self) -> bool:
        return self.status in FINAL_STATUSES


# --- a tenant-bound client's reads of its own runs (``lw.v1.rpc.runs.<verb>.<tenant>``) ------------------------
EVENT_FILTER_PATTERN = r"^lw\.v1\.evt(\.([A-Za-z0-9_-]{1,128}|\*))*(\.>)?$"  # a stem or stem pattern of events


class RunRead(Wire):
    """A client bound to a tenant asks the planner for one of its runs (``services/planner/reads.py``):
    ``state`` (the ``RunSnapshot``), ``history`` (its messages) or ``events`` (its stored events). The
    planner answers only for runs of the subject's tenant, and any other run exactly as a missing one.
    A long read comes in pages that each fit in one NATS message: ask again with ``start`` = ``next``."""

    run_id: RunId
    start: int | None = Field(
        None,
        ge=0,
        description="history: the first message's seq (default: the live history's first); "
        "events: the first stream sequence to read from",
    )
    end: int | None = Field(
        None, ge=0, description="history: the seq to stop before (default: the record's history_len)"
    )
    last: int | None = Field(None, ge=1, description="history, without start: only the last N messages")
    subjects: str = Field(
        "lw.v1.evt.>", max_length=256, pattern=EVENT_FILTER_PATTERN, description="events: a stem or stem pattern"
    )


class StoredItem(Wire):
    """A stored message or value as it is stored: a large one stays a claim-check reference (with the
    ``Lw-Payload-Ref`` header on an event; ``{"$lw_payload_ref": ...}`` as a value), which the reader fetches."""

    subject: str = ""
    seq: int = 0
    headers: dict[str, str] = Field(default_factory=dict)
    body: Any = None


class RunReadReply(Wire):
    """The planner's answer to a ``RunRead``: ``found`` false for a run that is not stored or not the asking
    tenant's (the same answer, so no tenant learns whether another's run exists)."""

    found: bool
    record: Any = Field(None, description="state: the RunSnapshot (a value-style reference when large)")
    items: list[StoredItem] = Field(default_factory=list, description="history: messages start..; events: events")
    start: int = Field(0, description="history: the seq of items[0]")
    end: int = Field(0, description="history: the seq this read stops before (pass it on with next)")
    next: int | None = Field(None, description="the rest: ask again with start = next; none: that was all")


Escalation.model_rebuild()
ToolCall.model_rebuild()
for _event in (Escalated, Resumed, BudgetThreshold, RunEvent):
    _event.model_rebuild()

# Every model that travels on the bus or sits in a shared bucket; schemas/ is generated from this.
WIRE_MODELS: tuple[type[BaseModel], ...] = (
    RunSubmit,
    RunAdvance,
    RunEvent,
    ToolContract,
    ToolCall,
    ToolResultRaw,
    ToolOutcome,
    ToolAttempt,
    CachedToolResult,
    JudgeRequest,
    Verdict,
    BudgetRequest,
    BudgetDecision,
    EscalationRaise,
    Escalation,
    EscalationResolution,
    EscalationQuery,
    EscalationClaim,
    EscalationResolve,
    EscalationReply,
    EscalationEvent,
    DeadLetter,
    Requeue,
    ErrorReply,
    McpServerStatus,
    RunSnapshot,
    Agent,
    AgentRecord,
    RunRead,
    RunReadReply,
)
