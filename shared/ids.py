"""The message ids the kernel's own parts publish under (the services' are in ``services/<name>/ids.py``)."""

from __future__ import annotations

import uuid


def letter_handled(service: str, seq: int) -> str:
    """A dead letter handled by ``service``: once per letter, however often the requeue is retried."""
    return f"handled-{service}-{seq}"


def rate_limited(run_id: str) -> str:
    """A run waiting for its provider key's rate limit: every wait is shown, so each has a fresh id."""
    return f"{run_id}.rate_limited.{uuid.uuid4().hex[:12]}"


def dead_letter(service: str, subject: str, seq: int | None, requeued_from: int | None = None) -> str:
    """A message ``service`` gave up on: once per stream message (``seq``), or per requeue command when a
    requeued letter failed again; a core NATS request has no sequence, so each of its letters is kept."""
    if requeued_from is not None:  # ``seq`` is the requeue command's (LW_CMD), not the message's own
        return f"dlq-{service}-requeue-{requeued_from}-{seq}"
    if seq:
        return f"dlq-{service}-{subject}-{seq}"
    return f"dlq-{service}-{uuid.uuid4().hex}"
