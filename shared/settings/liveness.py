"""Nothing silent: which replicas are alive (the registry in ``lw_replicas``), and when a run that waits on a
service with none is marked ``stalled`` (docs/operations.md, "Stalled runs")."""

from __future__ import annotations

from pydantic import BaseModel, Field


class LivenessSettings(BaseModel):
    replica_ttl_s: float = Field(
        30.0,
        ge=1,
        description="a replica not heard from for this long is gone (it heartbeats into lw_replicas at a third "
        "of it; the bucket's entries expire after it)",
    )
    stall_after_s: float = Field(
        60.0,
        gt=0,
        description="a run that has not moved for this long while a service it needs has no live replica is "
        "marked stalled (it moves on by itself once one is back)",
    )
    stall_sweep_s: float = Field(10.0, gt=0, description="how often the planner looks for such runs")

    @property
    def heartbeat_s(self) -> float:
        """How often a replica writes its entry: a third of ``replica_ttl_s``, so one late beat is not a death."""
        return self.replica_ttl_s / 3
