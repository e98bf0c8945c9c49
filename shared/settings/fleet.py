"""One fleet, many tenants (issue 34): each tenant's share, its cap on runs in flight, quotas and daily ceiling."""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator

from shared.tenancy import Defaults, Policy, TenantPolicy, resolve


class FleetSettings(BaseModel):
    tenant_daily_ceiling_usd: float | None = Field(
        None, gt=0, description="daily cost ceiling of every tenant (None: no tenant ceiling)"
    )
    tenant_ceilings: dict[str, float] = Field(
        default_factory=dict, description='JSON: tenant -> daily cost ceiling in USD, e.g. {"acme": 25}'
    )
    tenants: dict[str, TenantPolicy] = Field(
        default_factory=dict,
        description='JSON: tenant -> its policy over the defaults below, e.g. {"acme": {"weight": 2}}',
    )
    tenant_weight: float = Field(1.0, gt=0, le=1000, description="a tenant's share of the fleet unless LW_TENANTS says")
    tenant_max_running: int | None = Field(
        None, ge=1, description="a tenant's runs in flight at once, fleet-wide, unless LW_TENANTS says (None: no cap)"
    )
    quota_runs: int | None = Field(
        10_000, ge=1, description="a tenant's runs queued, running or waiting for a person (None: no quota)"
    )
    quota_human_items: int | None = Field(
        500, ge=1, description="a tenant's open items in the human queue (None: no quota)"
    )
    quota_stored_bytes: int | None = Field(
        2 * 1024**3, ge=1024, description="bytes a tenant's runs keep stored (None: no quota)"
    )
    # --- flow control: admission to the fleet (docs/flow-control.md) ---------------------------------------
    flow_capacity: int | None = Field(
        None,
        ge=1,
        description="runs the fleet has in flight at once, every tenant together (None: LW_FLOW_RUNS_PER_PLANNER "
        "x the planner replicas alive)",
    )
    flow_runs_per_planner: int | None = Field(
        None, ge=1, description="runs in flight per live planner replica (None: 2 x the planner's LW_MAX_IN_FLIGHT)"
    )
    flow_headroom: float = Field(
        0.1,
        ge=0,
        le=1,
        description="share of the capacity a tenant below its fair share may start past it (so a tenant arriving "
        "at a fleet full of another's runs starts its first runs at once instead of waiting for slots to free)",
    )
    flow_sweep_s: float = Field(
        2.0,
        gt=0,
        description="how often every planner replica sweeps the fleet's record: admits after a lost wake-up, frees "
        "the slots of runs that ended on a replica that died, says it is alive",
    )
    flow_grace_s: float = Field(
        10.0,
        gt=0,
        description="an admitted run still not started after this long is started by a replica's sweep (its "
        "admitter died between admitting and starting it)",
    )
    submit_answer_s: float = Field(
        30.0,
        gt=0,
        description="how long Client.submit (and `loopwarden submit`) waits for a planner to accept or refuse a "
        "submit before it says none answered (the submit stays stored and is taken when one runs)",
    )

    @field_validator("tenant_ceilings")
    @classmethod
    def _tenant_ceilings(cls, v: dict[str, float]) -> dict[str, float]:
        for tenant, ceiling in v.items():
            if ceiling <= 0:
                raise ValueError(f"{tenant}: a daily ceiling must be above 0 (got {ceiling})")
        return v

    def tenant_policy(self, tenant: str, configured: dict[str, TenantPolicy] | None = None) -> Policy:
        """``tenant``'s share and quotas: ``configured`` (the tenants file an admin applied) over ``LW_TENANTS``,
        over the defaults (``LW_TENANT_*``, ``LW_QUOTA_*``; the daily ceiling also from ``LW_TENANT_CEILINGS``)."""
        policies = {**self.tenants, **(configured or {})}
        own = policies.get(tenant)
        ceiling = self.tenant_ceilings.get(tenant, self.tenant_daily_ceiling_usd)
        if own is None or own.daily_ceiling_usd is None:
            policies[tenant] = (own or TenantPolicy()).model_copy(update={"daily_ceiling_usd": ceiling})
        defaults = Defaults(
            weight=self.tenant_weight,
            max_running=self.tenant_max_running,
            max_runs=self.quota_runs,
            max_human_items=self.quota_human_items,
            max_stored_bytes=self.quota_stored_bytes,
            daily_ceiling_usd=self.tenant_daily_ceiling_usd,
        )
        return resolve(tenant, policies, defaults)
