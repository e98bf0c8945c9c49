"""Tools: a tool's contract, the command that runs a call, its raw result, its outcome and its attempts."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from shared.failures import FailureType
from shared.messages.conversation import Usage
from shared.messages.wire import AttemptId, Boundary, CallId, Name, RunId, Wire, utcnow


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
    tenant: Name | None = Field(None, description="the tenant of the call's run (the planner sets it on the call)")


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
    tenant: Name | None = Field(None, description="the tenant of the call's run (the planner sets it on the call)")


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
    tenant: Name | None = Field(None, description="the tenant of the call's run (the planner sets it on the call)")

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


ToolCall.model_rebuild()
