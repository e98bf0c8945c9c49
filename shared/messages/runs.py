"""Starting a run (``RunSubmit``, a registered ``Agent``), its statuses and the planner's command to advance it."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import ConfigDict, Field

from shared.messages.judge import Rubric
from shared.messages.wire import (
    DIGEST_PATTERN,
    TASK_MAX_CHARS,
    CallId,
    Name,
    RunId,
    Wire,
    utcnow,
)
from shared.providers import ProviderName

PRIORITY_MIN, PRIORITY_MAX, DEFAULT_PRIORITY = 0, 9, 5


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
    max_rate_limit_wait_s: float | None = Field(
        None, gt=0, description="the longest one model call of the run waits for its provider key's rate limit"
    )


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
    priority: int | None = Field(
        None,
        ge=PRIORITY_MIN,
        le=PRIORITY_MAX,
        description="0..9, higher first: among its tenant's runs waiting for the fleet, a run of higher priority "
        f"is started first (then the oldest). None: {DEFAULT_PRIORITY}",
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
    registered_by: str | None = Field(
        None,
        max_length=64,
        description="the NATS user that registered this version, as the server authenticated it (the subject of "
        "its registration: rpc.agents.register.<user>); None: written before registrations were recorded",
    )


class AgentRegister(Wire):
    """An agent to register, sent by an operator (or the admin) on ``lw.v1.rpc.agents.register.<user>`` - a
    subject the server lets only that user publish - and answered by the escalation service, which holds the
    roster: whether this user may register it, or replace the agent already stored under its name, is the
    roster's decision (``OperatorEntry.agents``), and the record says who registered it."""

    agent: Agent


class AgentRegisterReply(Wire):
    ok: bool
    record: AgentRecord | None = None
    unchanged: bool = Field(False, description="the stored definition is this one already: nothing was written")
    error: str | None = Field(None, max_length=2000)


RunStatus = Literal["queued", "running", "awaiting_human", "completed", "stopped", "failed", "refused", "stalled"]
"""``queued``: accepted, waiting for its tenant's share of the fleet; ``refused``: a submit that was not started
(final, with the reason: ``RunSnapshot.refusal`` when refused at the door); ``stalled``: a message of the run was
dead-lettered or a service it needs has no live replica (not final: a requeue, a person or the replica coming
back moves it on; ``RunSnapshot.stall`` says why)."""
FinalStatus = Literal["completed", "stopped", "failed", "refused"]
FINAL_STATUSES: tuple[FinalStatus, ...] = ("completed", "stopped", "failed", "refused")
"""A run in one of these statuses is over: nothing moves it again."""
FINISHED_STATUSES: tuple[FinalStatus, ...] = ("completed", "stopped", "failed")
"""How a run that started ends (a refused one never started)."""

Quota = Literal["max_runs", "max_human_items", "max_stored_bytes", "daily_ceiling_usd", "submit_stream"]
"""What a submit was refused against (``Refusal.quota``); docs/flow-control.md says what each means."""


class Refusal(Wire):
    """Why a submit was refused at the door (``RunSnapshot.refusal``, the ``run.refused`` event's detail): the
    quota it would pass (None: not a quota - a submit the planner does not start, e.g. scripted runs off), its
    limit and the tenant's current figure, and one line for a person."""

    quota: Quota | None = None
    limit: float | None = None
    current: float | None = None
    reason: str = Field(max_length=2000)


class RunAdvance(Wire):
    """The command that asks the planner for the model turn of ``iteration``."""

    run_id: RunId
    iteration: int
