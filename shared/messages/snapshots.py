"""A run as the planner publishes it (``RunSnapshot``), and a tenant-bound client's reads of its own runs."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from shared.messages.conversation import ChatMessage, Usage
from shared.messages.runs import DEFAULT_PRIORITY, FINAL_STATUSES, Refusal, RunStatus
from shared.messages.wire import CallId, EscalationId, RunId, Wire, utcnow

# --- a run as the planner publishes it ---------------------------------------------------------


class IterationView(Wire):
    n: int
    kind: Literal["work", "synthesis", "retry"] = "work"


class AwaitingView(Wire):
    escalation_id: EscalationId
    kind: str
    call_id: CallId | None = None
    reason: str = ""


class StallView(Wire):
    """Why a run is ``stalled`` and what moves it on: a dead letter of the run (``loopwarden dlq requeue N``,
    or the queue item raised for it), or a service it needs that has no live replica (it moves on once one
    is back)."""

    reason: str = Field(max_length=2000, description="one line: what the run waits on")
    letters: list[int] = Field(
        default_factory=list, description="the run's dead letters (LW_DLQ numbers) it waits on: requeue them"
    )
    missing: str | None = Field(
        None, max_length=200, description="the service (or 'executor hosting <tool>') with no live replica"
    )
    escalation_id: EscalationId | None = Field(None, description="the queue item raised for the letter, if any")
    since: datetime = Field(default_factory=utcnow)


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
    rate_limited_s: float = Field(
        0.0, description="how long the run's model turns waited for their provider keys' rate limits, in total"
    )
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
    priority: int = Field(DEFAULT_PRIORITY, description="0..9, higher first among its tenant's waiting runs")
    admitted_at: datetime | None = Field(
        None, description="when it was admitted to the fleet (created_at until then: the wait for fair share)"
    )
    refusal: Refusal | None = Field(None, description="status refused: why the submit was refused")
    passed: bool | None = None
    first_draft_passed: bool | None = None
    awaiting: AwaitingView | None = None
    stall: StallView | None = Field(None, description="why the run is stalled (status ``stalled``), else none")
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

    @property
    def waited_s(self) -> float:
        """How long it waited for its tenant's share of the fleet (so far, while queued: None)."""
        return (self.admitted_at - self.created_at).total_seconds() if self.admitted_at is not None else 0.0


# --- a tenant-bound client's reads of its own runs (``lw.v1.rpc.runs.<verb>.<tenant>``) ------------------------
BUCKET_PATTERN = r"^lw_[a-z_]{1,61}$"
RUN_LIST_MAX = 200  # runs in one page of a tenant's list
EVENT_FILTER_PATTERN = r"^lw\.v1\.evt(\.([A-Za-z0-9_-]{1,128}|\*))*(\.>)?$"  # a stem or stem pattern of events


class RunRead(Wire):
    """A client bound to a tenant asks the planner for one of its runs (``services/planner/reads.py``):
    ``state`` (the ``RunSnapshot``), ``history`` (its messages), ``events`` (its stored events) or ``values``
    (what the run left in one of its buckets, for its export: ``bucket``, and ``key`` where the bucket keys
    the run's records by another id). The planner answers only for runs of the subject's tenant, and any
    other run exactly as a missing one. A long read comes in pages that each fit in one NATS message: ask
    again with ``start`` = ``next``."""

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
    bucket: str | None = Field(
        None,
        max_length=64,
        pattern=BUCKET_PATTERN,
        description="values: the bucket (lw_runs, lw_model_calls, lw_tool_ledger, lw_history, lw_budgets, "
        "lw_scenarios, lw_verdicts, lw_escalations)",
    )
    key: str | None = Field(
        None,
        max_length=256,
        pattern=r"^[A-Za-z0-9_.:=/-]{1,256}$",
        description="values: the key, in lw_verdicts (a candidate) and lw_escalations (an item) - of this run only",
    )


class RunQuery(Wire):
    """A client bound to a tenant lists its own runs (``lw.v1.rpc.runs.list.<tenant>``), newest first, filtered,
    a page at a time (``offset``, at most ``limit``); the planner answers with that tenant's runs only."""

    status: str | None = Field(None, max_length=32, pattern=r"^[a-z_]{1,32}$")
    agent: str | None = Field(None, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    since_s: float | None = Field(None, ge=0, le=10 * 365 * 86400, description="created at most this long ago")
    limit: int = Field(50, ge=1, le=RUN_LIST_MAX)
    offset: int = Field(0, ge=0, le=1_000_000)


class RunList(Wire):
    """The planner's answer to a ``RunQuery``: one page of the tenant's runs (each a ``RunSnapshot``, by reference
    when large), how many match, and the offset of the next page (none: that was the last)."""

    runs: list[Any] = Field(default_factory=list)
    total: int = 0
    next: int | None = None


class StoredItem(Wire):
    """A stored message or value as it is stored: a large one stays a claim-check reference (with the
    ``Lw-Payload-Ref`` header on an event; ``{"$lw_payload_ref": ...}`` as a value), which the reader fetches."""

    subject: str = ""
    seq: int = 0
    time: datetime | None = Field(None, description="events: when it was stored")
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
