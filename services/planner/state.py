"""The run state the planner keeps in JetStream KV (one key per run, CAS on revision)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.messages import (
    FINAL_STATUSES,
    Candidate,
    ChatMessage,
    EscalationKind,
    Rubric,
    RunStatus,
    ToolOutcome,
    Usage,
    Verdict,
    utcnow,
)

MAX_APPLIED = 256  # message ids remembered for de-duplication
MAX_OUTBOX = 12  # outboxes kept for re-publishing after a crash (the latest few are the ones a redelivery needs;
# every state write carries them, so more would make each step dearer)


class _State(BaseModel):
    model_config = ConfigDict(extra="ignore")


class RunConfig(_State):
    max_iterations: int
    max_judge_retries: int
    max_schema_corrections: int
    cost_ceiling_usd: float
    run_token_budget: int
    context_budget_tokens: int
    not_judged_policy: Literal["escalate", "retry", "accept", "fail"]
    loop_policy: Literal["stop", "escalate"]
    loop_window: int
    loop_repeat_threshold: int
    answer_mode: Literal["auto", "submit", "text"]
    terminal_tools: list[str]
    allowed_tools: list[str] | None
    rubric: Rubric | None
    scripted: bool
    lessons: bool
    model: str
    max_output_tokens: int
    max_tool_result_tokens: int
    keep_recent_turns: int
    tenant: str | None = None
    depth: int = 0
    parent_run_id: str | None = None
    parent_call_id: str | None = None
    parent_iteration: int = 0
    max_depth: int = 2
    max_children: int = 4
    child_ceiling_usd: float = 0.10
    child_max_iterations: int = 6
    spawn_gate_usd: float = 0.10


CallStatus = Literal["dispatched", "succeeded", "failed", "skipped", "blocked", "awaiting_human", "resolved_by_human"]


class ToolCallRecord(_State):
    call_id: str
    tool: str
    arguments: dict[str, Any]
    iteration: int
    signature: str
    status: CallStatus = "dispatched"
    terminal: bool = False
    result_text: str | None = None
    is_error: bool = False
    outcome: ToolOutcome | None = None

    @property
    def resolved(self) -> bool:
        return self.status not in ("dispatched", "awaiting_human")


class Awaiting(_State):
    escalation_id: str
    kind: EscalationKind
    call_id: str | None = None
    reason: str = ""


class DecisionRecord(_State):
    action: str
    row: int
    reason: str


class Iteration(_State):
    n: int
    kind: Literal["work", "synthesis", "retry"] = "work"
    tool_calls: list[ToolCallRecord] = Field(default_factory=list)
    candidate: Candidate | None = None
    judge_requested: bool = False
    verdict: Verdict | None = None
    guard: str | None = None
    decision: DecisionRecord | None = None
    notes: list[str] = Field(default_factory=list, description="text added to the next user turn")
    wrap_up: str | None = Field(None, description="why this is the run's last, tool-less turn (cost or iteration cap)")

    @property
    def pending(self) -> list[ToolCallRecord]:
        return [c for c in self.tool_calls if not c.resolved]


class PublishRecord(_State):
    subject: str
    msg_id: str
    payload: str  # the JSON body, kept verbatim so a re-publish is byte-identical
    model: str
    run_id: str | None = None  # published as another run's message (a sub-agent answering its parent)


class RunState(_State):
    run_id: str
    task: str
    status: RunStatus = "running"
    config: RunConfig
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)
    messages: list[ChatMessage] = Field(default_factory=list)
    summary: str | None = None
    compactions: int = 0
    iteration: Iteration
    model_calls: int = 0
    continue_count: int = 0
    retry_count: int = 0
    judge_seq: int = 0
    usage: Usage = Field(default_factory=Usage)
    tool_history: list[tuple[str, str]] = Field(default_factory=list, description="(tool, signature) per call")
    error_history: list[str] = Field(default_factory=list)
    schema_streak: dict[str, int] = Field(default_factory=dict)
    corrections: dict[str, dict[str, int]] = Field(default_factory=dict, description="per tool: failures, recovered")
    loop_reflections: int = 0
    judge_failures: list[str] = Field(default_factory=list, description="reasons the judge gave, for lessons")
    last_text: str = ""
    last_answer: str = ""
    last_submission: dict[str, Any] | None = None
    submitted: bool = Field(False, description="a terminal tool executed successfully (tool-call history)")
    final_output: str | None = None
    final_reason: str | None = None
    passed: bool | None = None
    first_draft_passed: bool | None = None
    first_draft_judged: bool = Field(False, description="the judge answered on the first draft (maybe: not judged)")
    events_published: int = Field(0, description="run events this run has published: the sequence in their ids")
    awaiting: Awaiting | None = None
    warnings: list[str] = Field(default_factory=list)
    children: dict[str, str] = Field(default_factory=dict, description="delegate call id -> sub-agent run id")
    delegated_usage: Usage = Field(default_factory=Usage, description="the part of usage its sub-agents spent")
    model: str = ""
    applied: list[str] = Field(default_factory=list)
    outbox: dict[str, list[PublishRecord]] = Field(default_factory=dict)

    def seen(self, msg_id: str) -> bool:
        return msg_id in self.applied

    def remember(self, msg_id: str, published: list[PublishRecord]) -> None:
        self.applied = [*self.applied, msg_id][-MAX_APPLIED:]
        self.outbox[msg_id] = published
        while len(self.outbox) > MAX_OUTBOX:
            self.outbox.pop(next(iter(self.outbox)))
        self.updated_at = utcnow()

    @property
    def done(self) -> bool:
        return self.status in FINAL_STATUSES
