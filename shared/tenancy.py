"""What each tenant may use of the fleet: its share, its cap on runs in flight and its quotas (pure).

A ``TenantPolicy`` names only what differs from the fleet's defaults (the ``LW_TENANT_*`` and ``LW_QUOTA_*``
settings); ``resolve`` fills in the rest. Where the per-tenant policies come from is the caller's: the
``LW_TENANTS`` setting, and the tenants file an admin applies (``loopwarden tenants``), which stores the same
model per tenant.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field

T = TypeVar("T")


class TenantPolicy(BaseModel):
    """One tenant's share of the fleet and its quotas; a field left out takes the fleet's default. (A wire
    model, as ``shared.messages.Wire`` makes them, without importing the contracts: ``lw_config``'s record,
    ``shared/messages/config.py``, holds it.)"""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    weight: float | None = Field(
        None, gt=0, le=1000, description="its share of the fleet while tenants compete for it (default 1)"
    )
    max_running: int | None = Field(None, ge=1, description="its runs in flight at once, fleet-wide")
    max_runs: int | None = Field(None, ge=1, description="quota: its runs queued, running or waiting for a person")
    max_human_items: int | None = Field(None, ge=1, description="quota: its open items in the human queue")
    max_stored_bytes: int | None = Field(None, ge=1024, description="quota: bytes its runs keep stored")
    daily_ceiling_usd: float | None = Field(None, gt=0, description="what its runs may spend per UTC day")


@dataclass(frozen=True)
class Policy:
    """A tenant's policy with every default filled in (``None``: no limit of that kind)."""

    tenant: str
    weight: float
    max_running: int | None
    max_runs: int | None
    max_human_items: int | None
    max_stored_bytes: int | None
    daily_ceiling_usd: float | None


@dataclass(frozen=True)
class Defaults:
    """The fleet's defaults for a tenant no policy names (from the settings)."""

    weight: float = 1.0
    max_running: int | None = None
    max_runs: int | None = None
    max_human_items: int | None = None
    max_stored_bytes: int | None = None
    daily_ceiling_usd: float | None = None


def resolve(tenant: str, policies: Mapping[str, TenantPolicy], defaults: Defaults) -> Policy:
    """``tenant``'s policy: what its own entry sets, the defaults for the rest."""
    own = policies.get(tenant) or TenantPolicy()
    return Policy(
        tenant=tenant,
        weight=own.weight if own.weight is not None else defaults.weight,
        max_running=_pick(own.max_running, defaults.max_running),
        max_runs=_pick(own.max_runs, defaults.max_runs),
        max_human_items=_pick(own.max_human_items, defaults.max_human_items),
        max_stored_bytes=_pick(own.max_stored_bytes, defaults.max_stored_bytes),
        daily_ceiling_usd=_pick(own.daily_ceiling_usd, defaults.daily_ceiling_usd),
    )


def _pick(value: T | None, default: T | None) -> T | None:
    return value if value is not None else default
