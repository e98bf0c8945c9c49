"""The run state the planner keeps in JetStream KV: a record of fixed size per run in ``lw_runs``
(CAS on revision), which extends the published ``RunSnapshot`` contract with the planner's private
fields, and the conversation in ``lw_history`` (``shared/history.py``; ``services/planner/store.py``
does the I/O). The pure state machine sees ``messages`` as one list; ``seal`` folds what it appended
(or replaced, on compaction) into the record's history pointers before a save."""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    field_serializer,
    model_validator,
)

from shared.messages import (
    AwaitingView,
    Candidate,
    ChatMessage,
    EscalationKind,
    IterationView,
    Rubric,
    RunAdvance,
    RunSnapshot,
    RunStatus,
    StallView,
    ToolOutcome,
    Usage,
    Verdict,
    utcnow,
)
from shared.messages.lean import lean_json

# Every step rewrites the record, so whatever it keeps is bounded, not a history:
MAX_APPLIED = 32  # latest message ids remembered for de-duplication (a run's messages come in order; an
# older one is stale anyway: its iteration has moved on, and each apply_* ignores it)
MAX_OUTBOX = 6  # outboxes kept for re-publishing after a crash (only the latest few can be redelivered);
# what this replica saw published leaves the record at its next save (``published``)
MIN_CALL_HISTORY = 4  # loop detection looks at the last loop_window calls and A-B-A-B (4)


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
    agent: str | None = None  # a run of a registered agent (services/planner/admission.with_agent)
    agent_version: int | None = None
    instructions: str = ""  # the agent's system prompt, ahead of the loop's rules
    max_rate_limit_wait_s: float | None = None  # a model call's longest wait for its rate limit (None: the setting)


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


class Awaiting(AwaitingView):
    kind: EscalationKind


class Stall(StallView):
    """Why the run is stalled (``services/planner/stalls.py``), as the planner keeps it. In memory the run keeps
    its own status (``running``, ``awaiting_human``) and every rule reads that; the record says ``stalled`` and
    keeps that status in ``was`` (``RunState`` writes and reads it so)."""

    was: RunStatus = "running"
    requeue_to: dict[int, str] = Field(
        default_factory=dict, description="letter -> where it is handed back (a letter not here cannot be)"
    )
    asked: list[int] = Field(default_factory=list, description="the letters a queue item was raised for")


class DecisionRecord(_State):
    action: str
    row: int
    reason: str


class Iteration(IterationView):
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
    """One message a transition produced. ``message`` is the typed message while it is in the hands of
    the process that produced it (metrics, the scheduled turn read it there); the record stores its
    JSON (``payload``), kept verbatim so a re-publish after a crash is byte-identical."""

    subject: str
    msg_id: str
    payload: str  # the JSON body, kept verbatim so a re-publish is byte-identical
    model: str
    run_id: str | None = None  # published as another run's message (a sub-agent answering its parent)
    _message: BaseModel | None = PrivateAttr(default=None)

    @classmethod
    def of(cls, subject: str, message: BaseModel, msg_id: str, run_id: str | None = None) -> PublishRecord:
        record = cls(
            subject=subject,
            msg_id=msg_id,
            payload=lean_json(message),
            model=type(message).__name__,
            run_id=run_id,
        )
        record._message = message
        return record

    @property
    def message(self) -> BaseModel | None:
        """The typed message, when this process produced it (None: read back from a stored record)."""
        return self._message

    def own_advance(self) -> RunAdvance | None:
        """The advance to its own run's next model turn this item carries (None: another message)."""
        if not is_own_advance(self):
            return None
        if isinstance(self._message, RunAdvance):
            return self._message
        return RunAdvance.model_validate_json(self.payload)  # an outbox read back from the record


def is_own_advance(item: PublishRecord) -> bool:
    """The advance to its own run's next model turn (not another run's message); by the stored model
    name, so it holds for an outbox read back from the record too."""
    return item.model == RunAdvance.__name__ and item.run_id is None


def schedules_turn(items: list[PublishRecord]) -> bool:
    """Whether an outbox carries the advance to its own run's next model turn."""
    return any(is_own_advance(i) for i in items)


class RunState(RunSnapshot):
    """The published snapshot plus what only the planner reads."""

    config: RunConfig
    iteration: Iteration
    awaiting: Awaiting | None = None
    stall: Stall | None = None
    messages: list[ChatMessage] = Field(default_factory=list, exclude=True, description="live history (lw_history)")
    tool_history: list[tuple[str, str]] = Field(
        default_factory=list, description="(tool, signature) of the latest calls (loop detection)"
    )
    error_history: list[str] = Field(default_factory=list, description="error keys of the latest failed calls")
    schema_streak: dict[str, int] = Field(default_factory=dict)
    loop_reflections: int = 0
    judge_failures: list[str] = Field(default_factory=list, description="reasons the judge gave, for lessons")
    last_text: str = ""
    last_answer: str = ""
    last_submission: dict[str, Any] | None = None
    first_draft_judged: bool = Field(False, description="the judge answered on the first draft (maybe: not judged)")
    events_published: int = Field(0, description="run events this run has published: the sequence in their ids")
    children: dict[str, str] = Field(default_factory=dict, description="delegate call id -> sub-agent run id")
    granted: dict[str, float] = Field(
        default_factory=dict, description="delegate call id -> the cost ceiling of a sub-agent still running"
    )
    delegated_usage: Usage = Field(default_factory=Usage, description="the part of usage its sub-agents spent")
    applied: list[str] = Field(default_factory=list)
    outbox: dict[str, list[PublishRecord]] = Field(default_factory=dict)
    trace_parent: str = Field("", description="W3C traceparent of the submit: the run's invoke_agent span hangs there")
    system_sha256: str = Field("", description="the system prompt the run last recorded in a model turn (by hash)")
    tools_sha256: str = Field("", description="the tools the run last recorded offered in a model turn (by hash)")
    published_bytes: int = Field(0, description="bytes of every message the run published (its stored-bytes quota)")
    pending_scenario: dict[str, Any] | None = Field(
        None, description="a queued scripted run's scenario (checked at the door), bound when it starts"
    )
    pending_replay: bool = Field(False, description="that scenario came on an operator's replay subject")
    # The messages list as last stored or read, and its length then: ``seal`` tells appended
    # messages from a replaced list (compaction). Whether the stored tail is in lw_history yet.
    _synced: list[ChatMessage] | None = PrivateAttr(default=None)
    _synced_len: int = PrivateAttr(default=0)
    _tail_stored: bool = PrivateAttr(default=False)
    # What ``context.model_messages`` last built from ``messages`` (a ``context.Sent``): the next
    # turn's request merges only the messages appended since, and sends the same merged objects.
    _sent: Any = PrivateAttr(default=None)

    # --- stalled: the record says so, the rules read the status underneath -----------------------------
    @field_serializer("status")
    def _stored_status(self, status: RunStatus) -> RunStatus:
        return "stalled" if self.stall is not None and not self.done else status

    @field_serializer("stall", mode="wrap")
    def _stored_stall(self, stall: Stall | None, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(stall)
        if isinstance(data, dict):
            data["was"] = self.status
        return data

    @model_validator(mode="after")
    def _status_underneath(self) -> Self:
        if self.status == "stalled":  # a stored record: the status the run has under its stall
            self.status = self.stall.was if self.stall is not None else "running"
        return self

    def seen(self, msg_id: str) -> bool:
        return msg_id in self.applied

    def remember(self, msg_id: str, published: list[PublishRecord]) -> None:
        """``msg_id`` is applied and published ``published``: kept are the newest outboxes and,
        however old, the newest one that schedules the run's next turn. That advance is taken where
        the message is handled (``Planner.handle``) and lives only in its outbox until the turn
        is applied: a redelivery after the turn failed (the model provider or the governor down a
        while) must still find it, whatever stray messages were applied meanwhile."""
        self.applied = [*self.applied, msg_id][-MAX_APPLIED:]
        self.outbox[msg_id] = published
        if len(self.outbox) > MAX_OUTBOX:
            newest = list(self.outbox)[-MAX_OUTBOX:]
            turn = next((k for k in reversed(self.outbox) if schedules_turn(self.outbox[k])), None)
            for key in [k for k in self.outbox if k not in newest and k != turn]:
                del self.outbox[key]
        self.updated_at = utcnow()

    def settle(self) -> None:
        """A finished run whose last outbox is published: what only a running run reads leaves its record
        (the last iteration's calls, candidate and verdict - the events and the export hold them -, the
        answer a final output was written from, outboxes left with an advance only: no turn of a finished
        run is taken). What readers of a finished run use stays: the snapshot, the applied ids (a late
        redelivery is still recognised), the tools it called, its config."""
        self.iteration = Iteration(n=self.iteration.n, kind=self.iteration.kind)
        self.last_text = self.last_answer = ""
        self.last_submission = None
        self.error_history, self.schema_streak = [], {}
        self.outbox = {k: v for k, v in self.outbox.items() if not all(is_own_advance(i) for i in v)}

    def published(self, msg_id: str, items: list[PublishRecord]) -> None:
        """This replica has every PubAck of ``items`` (of ``msg_id``'s outbox): they are in the streams,
        so the record's next save stops carrying them (a redelivery would only re-publish copies the
        server drops). What stays is what was not published, e.g. an advance whose turn is taken in
        place. Until that save, the stored record still carries them for a replica that dies now."""
        kept = self.outbox.get(msg_id)
        if kept is None:
            return
        done = {i.msg_id for i in items}
        rest = [i for i in kept if i.msg_id not in done]
        if rest:
            self.outbox[msg_id] = rest
        else:
            del self.outbox[msg_id]

    # --- the history pointers -------------------------------------------------------------------
    def loaded(self, messages: list[ChatMessage], *, tail_stored: bool) -> None:
        """``messages`` is the live history the record names (read back, or what this replica kept)."""
        self.messages = messages
        self._synced, self._synced_len = messages, len(messages)
        self._tail_stored = tail_stored

    @property
    def tail_stored(self) -> bool:
        return self._tail_stored or not self.tail

    def tail_is_stored(self) -> None:
        self._tail_stored = True

    def seal(self) -> None:
        """Before a save: the messages appended since the last save become the record's tail (a
        replaced list, after compaction, is the new live history from the next free seq on), and the
        lists loop detection reads are cut to what it looks at. The previous tail must be in
        lw_history by now (``tail_stored``): the record stops carrying it."""
        if self._synced is not None and self.messages is self._synced:
            new = self.messages[self._synced_len :]
        else:
            new = list(self.messages)
            self.history_start = self.history_len
        self.tail_from = self.history_len
        self.history_len += len(new)
        self.tail = new
        self._synced, self._synced_len = self.messages, len(self.messages)
        self._tail_stored = not new
        keep = max(self.config.loop_window, self.config.loop_repeat_threshold, MIN_CALL_HISTORY)
        self.tool_history = self.tool_history[-keep:]
        self.error_history = self.error_history[-keep:]
