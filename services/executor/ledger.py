"""The idempotency ledger (pure): what happened to each execution of a tool call.

Two writes per call, no more: the entry is *created* (compare-and-swap on "absent", which
is the claim itself: a first delivery reads nothing, only a create that finds an entry does)
before the tool first runs, and the *final* message — the result for the validator, the
fallback command, or the failure event — is recorded in one update after the last attempt,
*before* it is published. An idempotent tool's first delivery skips the claim (running it
again is harmless), so its call costs one write: the final, recorded with the create; a
delivery that finds it there publishes it. That create and the final's publish leave together
(one write to the server, acks awaited together; ``Finisher.finish``): a crash between them, or a
create that fails, leaves the call as it leaves any unclaimed idempotent call - run again by its
next delivery, whose final carries the same message id, so the stream keeps one; a create that
finds another delivery's final lets that final count (published too: the planner applies one
outcome per call). Every crash point is then covered:

* created, tool not (yet) run or its effect unknown -> no final: a non-idempotent tool is
  ``unknown_outcome`` (a human decides; it is never run again for this call), an
  idempotent one runs again;
* final recorded, not published (or published, not acked) -> the final is re-published
  with its message id, so the stream drops the duplicate.

There is deliberately no "attempt ended" record in between: a process that dies after the
side effect and before the final record leaves exactly the state of one that died during
the call, and both are unknown outcomes. A redelivery that runs an idempotent tool again
claims the entry (a create, or a CAS update with ``runs`` + 1), so two redeliveries never both
run it; an unclaimed first delivery still running elsewhere may (an idempotent tool allows it),
and a command delivered afresh after its final was recorded runs once more before its create
finds that final and publishes it instead (e.g. re-published by an older planner after the
de-duplication window).

**Whose call it is.** A claimed entry names its ``owner`` (the replica running the call) and a lease
(``lease_until``), renewed while the call runs. A delivery that finds the entry without a final while
the lease is live waits (the owner is alive: a NATS outage longer than the ack wait redelivers a command
whose call is still running); one that finds the lease lapsed still waits until *it* has seen the entry
unchanged for a whole lease (a lease lapses during an outage too: the owner cannot renew it until it
reconnects). Only then is the owner taken for gone, and the call an ``unknown_outcome``. A known result
wins over a recorded "unknown": the owner's final write that loses its compare-and-swap to one replaces
it (``on_final_conflict``).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, Field

from shared.messages import utcnow


class FinalPublish(BaseModel):
    subject: str
    msg_id: str
    payload: str
    unknown_outcome: bool = Field(False, description="the final says the outcome is unknown (a known one replaces it)")


class LedgerEntry(BaseModel):
    attempt_id: str
    tool: str
    idempotent: bool
    runs: int = Field(1, ge=1, description="deliveries that started executing this call")
    started_at: datetime = Field(default_factory=utcnow)
    final: FinalPublish | None = None
    owner: str | None = Field(None, description="the replica running the call (claimed it last)")
    lease_until: datetime | None = Field(None, description="the owner's lease: renewed while the call runs")


DeliveryAction = Literal["republish", "wait", "unknown_outcome", "run"]


def lease_live(entry: LedgerEntry, now: datetime) -> bool:
    return entry.lease_until is not None and now < entry.lease_until


def on_delivery(entry: LedgerEntry | None, now: datetime, unchanged_s: float, lease_s: float) -> DeliveryAction:
    """What a (re)delivered tool command must do, given the ledger; ``unchanged_s``: how long this replica
    has seen the entry as it is now (same revision), ``lease_s``: the owner's lease."""
    if entry is None:
        return "run"
    if entry.final is not None:
        return "republish"
    if lease_live(entry, now):
        return "wait"  # its owner is running it (and says so): never declared unknown, never run twice
    # Started before and no final recorded: the effect may or may not have happened.
    if entry.idempotent:
        return "run"
    # The lease lapsed, but an owner cut off from the bus cannot renew it: it is taken for gone only once
    # this replica, connected, has seen no renewal for a whole lease.
    return "unknown_outcome" if unchanged_s >= lease_s else "wait"


def claim(
    entry: LedgerEntry | None,
    attempt_id: str,
    tool: str,
    idempotent: bool,
    delivery: int = 1,
    *,
    owner: str | None = None,
    lease_until: datetime | None = None,
) -> LedgerEntry:
    """The entry to write (CAS) before the tool runs for this delivery (``delivery``: its count), owned by
    ``owner`` until ``lease_until``. An entry first created by a later delivery counts the earlier ones
    as runs: an idempotent call's first delivery runs unclaimed, and its events' ids (``runs`` in them)
    must not repeat."""
    lease = {"owner": owner, "lease_until": lease_until}
    if entry is None:
        return LedgerEntry(attempt_id=attempt_id, tool=tool, idempotent=idempotent, runs=max(1, delivery), **lease)
    return entry.model_copy(update={"runs": entry.runs + 1, **lease})


def renewed(entry: LedgerEntry, now: datetime, lease_s: float) -> LedgerEntry:
    """The entry with its owner's lease running ``lease_s`` from ``now``."""
    return entry.model_copy(update={"lease_until": now + timedelta(seconds=lease_s)})


ConflictAction = Literal["rewrite", "replace", "adopt", "retry_delivery"]


def on_final_conflict(stored: LedgerEntry | None, ours: FinalPublish, owner: str | None) -> ConflictAction:
    """The final write lost its compare-and-swap; ``stored`` is the entry now. ``rewrite``: only this
    owner's lease renewals moved it, write on its revision; ``replace``: another replica declared the
    outcome unknown, but this one knows it (it wins); ``adopt``: another delivery recorded a final first
    (it counts); ``retry_delivery``: someone else claimed the call (the delivery is retried)."""
    if stored is None:
        return "retry_delivery"
    if stored.final is None:
        return "rewrite" if owner is not None and stored.owner == owner else "retry_delivery"
    if stored.final.unknown_outcome and not ours.unknown_outcome:
        return "replace"
    return "adopt"
