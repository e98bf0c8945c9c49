"""Every message id the escalation service publishes under, in one place: an item is raised and resolved
once (a repeated raise or a redelivered resolution publishes under the same id), while each refused
attempt to act on it is an event of its own."""

from __future__ import annotations

import uuid


def raised(escalation_id: str) -> str:
    return f"raised.{escalation_id}"


def resolved(escalation_id: str) -> str:
    return f"resolved.{escalation_id}"


def refused(escalation_id: str) -> str:
    """A refusal: every attempt is kept, so each has a fresh id."""
    return f"refused.{escalation_id}.{uuid.uuid4().hex[:12]}"
