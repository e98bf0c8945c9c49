"""Each tenant's policy (its share, cap and quotas), as every part of flow control reads it: one place.

``Settings.tenant_policy`` resolves a tenant's policy from ``LW_TENANTS`` and the ``LW_TENANT_*``/``LW_QUOTA_*``
defaults, over the per-tenant map an admin applied (``configured``). Where that map comes from is
``configured()`` here: nothing yet (the tenants file's ``lw_config`` bucket plugs in here), so every caller -
the planner's intake and admission, the governor's ceiling, the fleet view - gets the same answer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from shared.settings import Settings
from shared.tenancy import Policy, TenantPolicy

Configured = Callable[[], Awaitable[dict[str, TenantPolicy] | None]]


async def _none() -> dict[str, TenantPolicy] | None:
    return None


class Policies:
    """``await policies.of(tenant)``: the tenant's policy now. ``configured``: a reader of the per-tenant map an
    admin applied (None until the tenants' configuration is stored where services read it)."""

    def __init__(self, settings: Settings, configured: Configured | None = None) -> None:
        self.settings = settings
        self.configured = configured or _none

    async def of(self, tenant: str) -> Policy:
        return self.settings.tenant_policy(tenant, await self.configured())

    async def tenants(self) -> dict[str, TenantPolicy]:
        """Every tenant a policy names (``LW_TENANTS`` and the configured map)."""
        return {**self.settings.tenants, **(await self.configured() or {})}
