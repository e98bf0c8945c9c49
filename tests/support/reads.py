"""What end-to-end modules read off the bus besides the client's views: the planner's own record of a run,
the registered tool contracts, a tenant's spend today."""

from __future__ import annotations

import asyncio

from loopwarden.client import Client
from services.planner.state import RunState
from shared import subjects as S
from shared.flow import TenantDay, today
from shared.flow import day_key as tenant_key
from shared.messages import ToolContract
from tests.support.timing import bound


async def planner_record(client: Client, run_id: str) -> RunState:
    """The planner's own record of a run (its configuration and children; the client reads the snapshot)."""
    record, _ = await client.bus.kv_get(S.KV_RUNS, run_id, RunState)
    assert record is not None, run_id
    return record


async def registered(client: Client) -> dict[str, ToolContract]:
    """Every tool contract registered on the bus, by name."""
    found: dict[str, ToolContract] = {}
    for key in await client.bus.keys(S.KV_CONTRACTS):
        contract, _ = await client.bus.kv_get(S.KV_CONTRACTS, key, ToolContract)
        if contract is not None:
            found[contract.name] = contract
    return found


async def tenant_spent(client: Client, tenant: str, at_least: float, timeout: float = bound(10.0)) -> float:
    """The tenant's spend today, once it reaches ``at_least`` (what it is after ``timeout`` otherwise)."""
    spent = 0.0
    for _ in range(int(timeout / 0.1)):
        record, _ = await client.bus.kv_get(S.KV_BUDGETS, tenant_key(tenant, today()), TenantDay)
        spent = record.spent_usd if record else 0.0
        if spent >= at_least:
            return spent
        await asyncio.sleep(0.1)
    return spent
