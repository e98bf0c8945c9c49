"""Flow control's rules, pure (no bus): who is admitted to the fleet when runs wait, what a submit is refused
against, what the fleet's admission record holds, what a tenant spent today. The planner runs them
(``services/planner/flow.py``, ``services/planner/intake.py``), the governor keeps the day's spend, and
``loopwarden fleet`` shows them. docs/flow-control.md explains the model."""

from __future__ import annotations

from shared.flow.fleet import (
    WINDOW_MIN,
    FleetRecord,
    admit,
    dequeue,
    drift,
    enqueue,
    forget_stored,
    heartbeat,
    hold,
    live_planners,
    recount,
    release,
    take_at_once,
)
from shared.flow.policies import Policies
from shared.flow.quotas import Usage, refusal, submit_stream_refusal
from shared.flow.rules import Share, capacity_of, pick, plan
from shared.flow.spend import TenantDay, day_key, today
from shared.flow.sweep import Check, due, verdict
from shared.flow.view import fleet_view

__all__ = [
    "WINDOW_MIN",
    "Check",
    "FleetRecord",
    "Policies",
    "Share",
    "TenantDay",
    "Usage",
    "admit",
    "capacity_of",
    "day_key",
    "dequeue",
    "drift",
    "due",
    "enqueue",
    "fleet_view",
    "forget_stored",
    "heartbeat",
    "hold",
    "live_planners",
    "pick",
    "plan",
    "recount",
    "refusal",
    "release",
    "submit_stream_refusal",
    "take_at_once",
    "today",
    "verdict",
]
