"""The message id the validator publishes under: a pure function of the attempt, so a redelivered result
publishes its outcome once (the executor's failure of the same attempt has its own, ``executor/ids.failed``)."""

from __future__ import annotations


def validated(attempt_id: str) -> str:
    return f"{attempt_id}.validated"
