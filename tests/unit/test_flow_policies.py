"""Each tenant's policy as flow control reads it (``shared/flow/policies.py``): resolved once per map an admin
applied (every submit and budget request asks), and again as soon as the map read is another one."""

from __future__ import annotations

import asyncio

from shared.flow import Policies
from shared.settings import Settings
from shared.tenancy import TenantPolicy


def test_a_policy_is_resolved_once_per_map_read_and_again_when_the_map_changes() -> None:
    applied: dict[str, TenantPolicy] = {"acme": TenantPolicy(weight=3)}

    async def configured() -> dict[str, TenantPolicy]:
        return applied

    async def scenario() -> None:
        nonlocal applied
        policies = Policies(Settings(quota_runs=50), configured)
        first = await policies.of("acme")
        assert first.weight == 3 and first.max_runs == 50
        assert await policies.of("acme") is first  # the same map: not resolved again
        assert (await policies.of("other")).weight == 1
        assert policies.known("acme") is first  # without a read (the weight of each commit): the same
        applied = {"acme": TenantPolicy(weight=5, max_runs=7)}  # an admin applied another file
        assert policies.known("acme") is first  # known: as last read, until a read finds the new map
        again = await policies.of("acme")
        assert again.weight == 5 and again.max_runs == 7
        assert policies.known("acme") is again

    asyncio.run(scenario())
