"""Each tenant's policy (its share, cap and quotas), as every part of flow control reads it: one place.

``Settings.tenant_policy`` resolves a tenant's policy from ``LW_TENANTS`` and the ``LW_TENANT_*``/``LW_QUOTA_*``
defaults, over the per-tenant map an admin applied (``configured``). Where that map comes from is
``configured()``: the services pass ``LiveConfig(bus).policies`` (the access file an admin applied, read from
``lw_config`` at most ``LW_CONFIG_REFRESH_S`` old), so every caller - the planner's intake and admission, the
governor's ceiling, the fleet view - gets the same answer. A read that fails keeps the map read last (the
settings alone before any was read): a policy is never refused for a bucket that does not answer.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from shared.settings import Settings
from shared.tenancy import Policy, TenantPolicy

log = logging.getLogger("loopwarden.flow")
Configured = Callable[[], Awaitable[dict[str, TenantPolicy] | None]]


async def _none() -> dict[str, TenantPolicy] | None:
    return None


class Policies:
    """``await policies.of(tenant)``: the tenant's policy now. ``configured``: a reader of the per-tenant map an
    admin applied (None until the tenants' configuration is stored where services read it)."""

    def __init__(self, settings: Settings, configured: Configured | None = None) -> None:
        self.settings = settings
        self.read = configured or _none
        self.last: dict[str, TenantPolicy] | None = None  # the configured map read last
        # each tenant's policy resolved from the map read last (every submit and budget request asks for one)
        self._resolved: dict[str, Policy] = {}
        self._resolved_from: dict[str, TenantPolicy] | None = None

    async def configured(self) -> dict[str, TenantPolicy] | None:
        try:
            self.last = await self.read()
        except Exception as err:  # lw_config not answering, a value that does not parse: the last map read
            log.warning("tenants' policies not read again (%s); acting on the last read", err)
        return self.last

    async def of(self, tenant: str) -> Policy:
        return self._resolve(tenant, await self.configured())

    def known(self, tenant: str) -> Policy:
        """The tenant's policy as last read, without a read (a metric's callback; the weight of every commit the
        planner publishes)."""
        return self._resolve(tenant, self.last)

    def _resolve(self, tenant: str, configured: dict[str, TenantPolicy] | None) -> Policy:
        if configured is not self._resolved_from:  # resolved again once the map read is another one
            self._resolved.clear()
            self._resolved_from = configured
        policy = self._resolved.get(tenant)
        if policy is None:
            if len(self._resolved) >= 4096:
                self._resolved.clear()
            policy = self._resolved[tenant] = self.settings.tenant_policy(tenant, configured)
        return policy

    async def tenants(self) -> dict[str, TenantPolicy]:
        """Every tenant a policy names (``LW_TENANTS`` and the configured map)."""
        return {**self.settings.tenants, **(await self.configured() or {})}
