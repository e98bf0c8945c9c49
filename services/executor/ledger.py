"""The idempotency ledger (pure): what happened to each execution of a tool call.

Every attempt is recorded *before* the tool runs and completed after it returns. On a
redelivered command the ledger tells the executor what to do: republish a recorded
result, run again (idempotent tool, or a previous attempt that is known to have failed),
or — for a non-idempotent tool whose last attempt has no recorded end — refuse to guess:
the outcome is ``unknown_outcome`` and a human decides.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from shared.messages import utcnow


class AttemptRecord(BaseModel):
    n: int
    started_at: datetime = Field(default_factory=utcnow)
    finished: bool = False
    ok: bool = False
    failure_type: str | None = None
    error: str | None = None


class FinalPublish(BaseModel):
    subject: str
    msg_id: str
    payload: str


class LedgerEntry(BaseModel):
    attempt_id: str
    tool: str
    idempotent: bool
    attempts: list[AttemptRecord] = Field(default_factory=list)
    final: FinalPublish | None = None


Verdict = Literal["republish", "unknown_outcome", "run"]


def on_delivery(entry: LedgerEntry | None) -> Verdict:
    """What a (re)delivered tool command must do, given the ledger."""
    if entry is None:
        return "run"
    if entry.final is not None:
        return "republish"
    in_flight = bool(entry.attempts) and not entry.attempts[-1].finished
    if in_flight and not entry.idempotent:
        return "unknown_outcome"
    return "run"
