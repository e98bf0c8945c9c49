"""The idempotency ledger (pure): what happened to each execution of a tool call.

Two writes per call, no more: the entry is *created* (compare-and-swap on "absent", which
is the claim itself: a first delivery reads nothing, only a create that finds an entry does)
before the tool first runs, and the *final* message — the result for the validator, the
fallback command, or the failure event — is recorded in one update after the last attempt,
*before* it is published. An idempotent tool's first delivery skips the claim (running it
again is harmless), so its call costs one write: the final, recorded with the create; a
delivery that finds it there publishes it. Every crash point is then covered:

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
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from shared.messages import utcnow


class FinalPublish(BaseModel):
    subject: str
    msg_id: str
    payload: str


class LedgerEntry(BaseModel):
    attempt_id: str
    tool: str
    idempotent: bool
    runs: int = Field(1, ge=1, description="deliveries that started executing this call")
    started_at: datetime = Field(default_factory=utcnow)
    final: FinalPublish | None = None


DeliveryAction = Literal["republish", "unknown_outcome", "run"]


def on_delivery(entry: LedgerEntry | None) -> DeliveryAction:
    """What a (re)delivered tool command must do, given the ledger."""
    if entry is None:
        return "run"
    if entry.final is not None:
        return "republish"
    # Started before and no final recorded: the effect may or may not have happened.
    return "run" if entry.idempotent else "unknown_outcome"


def claim(entry: LedgerEntry | None, attempt_id: str, tool: str, idempotent: bool, delivery: int = 1) -> LedgerEntry:
    """The entry to write (CAS) before the tool runs for this delivery (``delivery``: its count). An
    entry first created by a later delivery counts the earlier ones as runs: an idempotent call's
    first delivery runs unclaimed, and its events' ids (``runs`` in them) must not repeat."""
    if entry is None:
        return LedgerEntry(attempt_id=attempt_id, tool=tool, idempotent=idempotent, runs=max(1, delivery))
    return entry.model_copy(update={"runs": entry.runs + 1})
