"""What flow control costs a run, against a real nats-server (docs/flow-control.md, "What it costs"): a tenant's day
is written a few times a second however many turns its runs take and however many end, on the record the replica
wrote last, and at once where a budget decision waits for it; an admission round reads the waiting tickets only as
far as it needs; the tenants' policies are read once per refresh, however many submits ask at once."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator

import pytest

from loopwarden.stack import LocalStack
from services.governor.handlers import SETTLE_EVERY_S, SPEND_EVERY_S, TenantDays
from services.planner.flow import Flow
from shared import subjects as S
from shared.bus import Bus
from shared.flow import FleetRecord, TenantDay, day_key, today
from shared.live_config import LiveConfig
from shared.messages import FlowTicket
from shared.settings import Settings
from shared.telemetry import setup_telemetry
from tests.support.timing import bound


@pytest.fixture
async def bus(stack: LocalStack) -> AsyncIterator[Bus]:
    b = Bus(Settings(nats_url=str(stack.nats_url)), "flowcosts")
    await b.connect()
    yield b
    await b.stop()


async def stored_day(bus: Bus, tenant: str) -> TenantDay:
    day, _ = await bus.kv_get(S.KV_BUDGETS, day_key(tenant, today()), TenantDay)
    assert day is not None, f"no day stored for {tenant}"
    return day


async def test_a_tenants_day_is_written_a_few_times_a_second_however_many_turns_and_adds_up(bus: Bus) -> None:
    """60 turns' spend and 20 runs' final totals over about a second, nobody waiting for the day: a handful of
    writes (the spend gathered for ``SPEND_EVERY_S``, a final total for at most ``SETTLE_EVERY_S``), and the stored
    day is every run's latest total, settled runs folded in once."""
    tenant = f"cost{os.urandom(3).hex()}"
    days = TenantDays(bus)
    started = time.monotonic()
    futures = []
    for k in range(60):
        futures.append(days.add(tenant, "spend", f"run-{k % 20}", 0.01 * (k // 20 + 1), now=False))  # 3 turns each
        await asyncio.sleep(0.01)
    for k in range(20):  # the runs end, one after another
        futures.append(days.add(tenant, "settle", f"run-{k}", 0.03 + (0.02 if k == 0 else 0.0), now=False))
        await asyncio.sleep(0.01)
    totals = await asyncio.wait_for(asyncio.gather(*futures), bound(10))
    elapsed = time.monotonic() - started
    assert totals[-1] == pytest.approx(19 * 0.03 + 0.05)
    assert days.writes <= elapsed / SETTLE_EVERY_S + 2, f"{days.writes} writes in {elapsed:.2f}s"
    assert days.writes < 10
    day = await stored_day(bus, tenant)
    assert day.spent_usd == pytest.approx(19 * 0.03 + 0.05)
    assert day.settled_runs == 20 and day.runs == {}


async def test_a_decision_that_waits_for_the_day_is_written_at_once_the_rest_waits_its_turn(bus: Bus) -> None:
    tenant = f"cost{os.urandom(3).hex()}"
    days = TenantDays(bus)
    assert await asyncio.wait_for(days.add(tenant, "spend", "run-a", 1.0), bound(5)) == 1.0  # awaited: at once
    later = days.add(tenant, "spend", "run-b", 2.0, now=False)
    await asyncio.sleep(SPEND_EVERY_S / 2)
    assert not later.done()  # nobody waits for it: gathered for SPEND_EVERY_S
    urgent = days.add(tenant, "spend", "run-c", 4.0)
    assert await asyncio.wait_for(urgent, bound(5)) == 7.0  # written now, with what waited before it
    assert later.done() and later.result() == 7.0
    assert (await stored_day(bus, tenant)).spent_usd == 7.0


async def test_two_replicas_writing_one_tenants_day_lose_nothing(stack: LocalStack, bus: Bus) -> None:
    """Each replica writes on the record it wrote last; the other's writes make that a conflict, read again."""
    tenant = f"cost{os.urandom(3).hex()}"
    other = Bus(Settings(nats_url=str(stack.nats_url)), "flowcosts2")
    await other.connect()
    try:
        one, two = TenantDays(bus), TenantDays(other)
        futures = []
        for k in range(40):
            futures.append((one if k % 2 else two).add(tenant, "settle", f"run-{k}", 0.5, now=False))
            await asyncio.sleep(0.01)
        await asyncio.wait_for(asyncio.gather(*futures), bound(20))
    finally:
        await other.stop()
    day = await stored_day(bus, tenant)
    assert day.settled_runs == 40 and day.spent_usd == pytest.approx(20.0)


async def test_an_admission_round_reads_the_tickets_only_as_far_as_it_needs(bus: Bus) -> None:
    """The tickets of runs admitted already (not removed yet) are read and passed over, then as many waiting ones
    as the round wants, and no more; when fewer wait, all there are."""
    tenant = f"cost{os.urandom(3).hex()}"
    subject = S.flow_ticket(tenant, 0)
    for k in range(30):
        await bus.publish(subject, FlowTicket(run_id=f"run-{k:02d}", tenant=tenant, priority=0))
    flow = Flow(bus, bus.settings, setup_telemetry("flowcosts", Settings()), begin=lambda run_id: asyncio.sleep(0))
    admitted = FleetRecord(running={tenant: {f"run-{k:02d}": 0.0 for k in range(20)}})

    tickets = await flow.waiting_tickets(subject, 5, admitted)
    assert [t.run_id for t, _ in tickets] == [f"run-{k:02d}" for k in range(25)]
    tickets = await flow.waiting_tickets(subject, 5, FleetRecord())
    assert [t.run_id for t, _ in tickets] == [f"run-{k:02d}" for k in range(5)]
    tickets = await flow.waiting_tickets(subject, 50, admitted)
    assert len(tickets) == 30


async def test_a_burst_of_callers_of_the_tenants_policies_makes_one_read_per_refresh(bus: Bus) -> None:
    """Dozens of submits ask for the tenants' policies at once: one read of lw_config, shared; the next refresh
    reads once again."""
    live = LiveConfig(bus, refresh_s=600)
    first = await asyncio.wait_for(asyncio.gather(*(live.policies() for _ in range(50))), bound(10))
    assert live.reads == 1 and all(p == first[0] for p in first)
    live.refresh_s = 0  # every value is old now
    await asyncio.wait_for(asyncio.gather(*(live.policies() for _ in range(50))), bound(10))
    assert live.reads <= 3  # the callers that came while a read was under way shared it
