"""Every message id the executor publishes under, in one place.

Exactly-once rests on these: a redelivered call publishes under the same ids, so JetStream drops the
copies. Each is a pure function of the call's attempt id, the ledger's run count of it and the attempt
number, never of time or chance (``services/planner/ids.py`` is the planner's).
"""

from __future__ import annotations

from shared import subjects as S
from shared.failures import FailureType


def attempt_failed(attempt_id: str, runs: int, n: int) -> str:
    """One failed attempt of a call, as its ``tool.attempt`` event (the ``runs``-th run of it, attempt ``n``)."""
    return f"{attempt_id}.attempt.{runs}.{n}"


def retrying(attempt_id: str, runs: int, n: int) -> str:
    """A failure the executor goes on from (``will_retry``), after attempt ``n`` of the ``runs``-th run."""
    return f"{attempt_id}.failure.{runs}.{n}"


def failed(attempt_id: str, failure_type: FailureType) -> str:
    """A call's failure event: one per failure type, so the validator's outcome (``<attempt>.validated``) and
    an executor's failure of the same attempt never de-duplicate each other, while a redelivery of the same
    event does."""
    return f"{attempt_id}.failed.{S.token(failure_type)}"


def undeliverable(attempt_id: str) -> str:
    """The failure recorded in place of a final message the server refuses for good."""
    return f"{attempt_id}.undeliverable"


def mismatch_letter(subject_tool: str, attempt_id: str) -> str:
    """The dead letter of a call that arrived on another tool's subject."""
    return f"dlq-executor-mismatch-{subject_tool}-{attempt_id}"
