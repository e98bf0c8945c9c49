"""The fleet as flow control sees it (``loopwarden fleet``, the console's /fleet page): per tenant what waits,
what runs, what finished, how long runs waited for their share, and each quota's use; and what the escalation
service tells the planners about each tenant's open items in the human queue."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import Field

from shared.messages.runs import Quota
from shared.messages.wire import Name, RunId, Wire, utcnow


class FlowQuery(Wire):
    """Ask a planner for the fleet's view (``lw.v1.rpc.flow.view``; a tenant-bound client on
    ``lw.v1.rpc.flow.view.<tenant>`` gets its own tenant's row only)."""

    tenant: Name | None = Field(None, description="only this tenant's row (None: every tenant's)")


class QuotaUse(Wire):
    quota: Quota
    limit: float | None = Field(None, description="None: no limit of this kind")
    current: float = 0.0


class TenantFlow(Wire):
    tenant: Name
    weight: float = 1.0
    max_running: int | None = None
    queued: int = 0
    queued_by_priority: dict[str, int] = Field(default_factory=dict, description="priority -> runs waiting")
    running: int = 0
    waiting_for_people: int = Field(0, description="its open items in the human queue (runs waiting hold no slot)")
    finished_per_min: float = Field(0.0, description="runs of it that ended, per minute, over the last minutes")
    waited_s: float = Field(0.0, description="mean time its runs admitted lately waited for their share")
    oldest_wait_s: float = Field(0.0, description="how long its oldest waiting run has waited so far")
    rate_limited_s: float = Field(
        0.0, description="mean time its runs that ended lately waited for the model providers' rate limits"
    )
    quotas: list[QuotaUse] = Field(default_factory=list)


class FleetView(Wire):
    at: datetime = Field(default_factory=utcnow)
    capacity: int = Field(0, description="runs the fleet admits at once (LW_FLOW_CAPACITY, or per live planner)")
    running: int = 0
    queued: int = 0
    planners: int = Field(0, description="planner replicas seen alive by flow control")
    window_s: float = Field(0.0, description="what finished_per_min and waited_s are averaged over")
    tenants: list[TenantFlow] = Field(default_factory=list)
    providers: list[dict[str, Any]] = Field(
        default_factory=list, description="per provider key: limits learned or set, what is left, the wait"
    )


class OpenItems(Wire):
    """Per tenant, its open items in the human queue: the escalation service keeps it (``lw_human_counts``,
    key ``open``) and the planners read it for the ``max_human_items`` quota and the fleet view."""

    counts: dict[str, int] = Field(default_factory=dict)
    at: datetime = Field(default_factory=utcnow)


class FlowTicket(Wire):
    """A run waiting for its tenant's share of the fleet (``lw.v1.flow.ticket.<tenant>.<priority>`` in
    ``LW_FLOW``): the run's record (status ``queued``) holds everything else."""

    run_id: RunId
    tenant: Name
    priority: int = Field(ge=0, le=9)
    queued_at: datetime = Field(default_factory=utcnow)
