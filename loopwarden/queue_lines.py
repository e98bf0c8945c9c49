"""How a queue item's events read in a run's history (``loopwarden events``, the demo's progress)."""

from __future__ import annotations

from typing import Any


def escalation_detail(p: dict[str, Any]) -> str:
    """What happened to a queue item, in words: its id, who acted, how, why (never an empty tail)."""
    parts = [str(p.get("escalation_id") or "(no id)")]
    if p.get("operator"):
        parts.append(f"by {p['operator']}" + (f" via {p['via']}" if p.get("via") else ""))
    if p.get("action"):
        parts.append(f"action {p['action']}")
    if p.get("lease_expires_at"):
        parts.append(f"lease until {str(p['lease_expires_at'])[11:19]}")
    if p.get("reason"):
        parts.append(f"- {str(p['reason'])[:100]}")
    return " ".join(parts)
