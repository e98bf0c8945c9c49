"""``shared.bus.gate.FairGate``: a replica's sections of work (the planner's commits) given places by tenant."""

from __future__ import annotations

import asyncio

from shared.bus import FairGate, tenant_scope
from shared.bus.gate import Presence


async def _section(gate: FairGate, tenant: str, log: list[str], release: asyncio.Event, peak: list[int]) -> None:
    with tenant_scope(tenant):
        async with gate.section():
            log.append(tenant)
            peak[0] = max(peak[0], gate.running)
            await release.wait()


async def test_no_more_sections_run_at_once_than_the_limit_and_every_one_runs() -> None:
    """A gate without a replica's presence keeps its bound always (a tenant alone too)."""
    gate, log, peak, release = FairGate(2, headroom=0), [], [0], asyncio.Event()
    tasks = [asyncio.create_task(_section(gate, "a", log, release, peak)) for _ in range(10)]
    await asyncio.sleep(0)
    assert (len(log), len(gate)) == (2, 8)
    release.set()
    await asyncio.gather(*tasks)
    assert (len(log), peak[0], gate.running, len(gate)) == (10, 2, 0, 0)


async def test_another_tenants_section_goes_before_a_backlogs_waiting_ones() -> None:
    """a holds both places and has 6 waiting; b's two sections arrive. Sections end in the order they started: b
    is given the first place that frees and then holds one of the two (its share) until its two are done, not
    after a's backlog (first come, first served: places 8 and 9)."""
    gate = FairGate(2, headroom=0)
    order: list[str] = []
    running: list[asyncio.Event] = []  # in the order the sections started

    async def one(tenant: str) -> None:
        with tenant_scope(tenant):
            async with gate.section():
                order.append(tenant)
                release = asyncio.Event()
                running.append(release)
                await release.wait()

    tasks = [asyncio.create_task(one("a")) for _ in range(8)]
    await asyncio.sleep(0)
    tasks += [asyncio.create_task(one("b")) for _ in range(2)]
    await asyncio.sleep(0)
    assert order == ["a", "a"]
    for n in range(10):
        running[n].set()
        for _ in range(3):
            await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    assert [n for n, tenant in enumerate(order) if tenant == "b"] == [2, 4], order


async def test_a_tenant_below_its_share_starts_at_once_within_the_headroom() -> None:
    gate, log, peak, release = FairGate(4, headroom=0.25), [], [0], asyncio.Event()
    tasks = [asyncio.create_task(_section(gate, "a", log, release, peak)) for _ in range(8)]
    await asyncio.sleep(0)
    tasks.append(asyncio.create_task(_section(gate, "b", log, release, peak)))
    await asyncio.sleep(0)
    assert log == ["a"] * 4 + ["b"]  # b started past the limit, by the headroom's one place
    release.set()
    await asyncio.gather(*tasks)


async def test_a_section_cancelled_while_it_waits_passes_its_place_on() -> None:
    gate, log, peak, release = FairGate(1, headroom=0), [], [0], asyncio.Event()
    first = asyncio.create_task(_section(gate, "a", log, release, peak))
    await asyncio.sleep(0)
    cancelled = asyncio.create_task(_section(gate, "b", log, release, peak))
    last = asyncio.create_task(_section(gate, "c", log, release, peak))
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(first, last)
    assert cancelled.cancelled() and log == ["a", "c"]
    assert (gate.running, len(gate)) == (0, 0)


async def test_a_limit_of_zero_bounds_nothing() -> None:
    gate, log, peak, release = FairGate(0), [], [0], asyncio.Event()
    tasks = [asyncio.create_task(_section(gate, "a", log, release, peak)) for _ in range(50)]
    await asyncio.sleep(0)
    assert len(log) == 50
    release.set()
    await asyncio.gather(*tasks)


def present(*tenants: str) -> Presence:
    """A replica's presence with one message held of each of ``tenants``."""
    presence = Presence()
    for tenant in tenants:
        presence.arrive(tenant)
    return presence


async def test_a_tenant_alone_in_the_replica_runs_every_section_at_once() -> None:
    """Nobody else has work here: bounding the lone tenant's sections would share nothing."""
    gate, log, peak, release = FairGate(2, headroom=0, presence=present("a")), [], [0], asyncio.Event()
    tasks = [asyncio.create_task(_section(gate, "a", log, release, peak)) for _ in range(10)]
    await asyncio.sleep(0)
    assert (len(log), len(gate), gate.running) == (10, 0, 10)
    release.set()
    await asyncio.gather(*tasks)
    assert gate.running == 0


async def test_the_bound_holds_once_another_tenant_is_present_and_its_sections_start_at_once() -> None:
    """a's sections ran unbounded while it was alone; b's message arrives in the replica: a's next sections wait
    for a place (the limit counts only the bounded ones), and b's start at once, as the gate's rule gives them."""
    presence = present("a")
    gate, log, peak, release = FairGate(2, headroom=0, presence=presence), [], [0], asyncio.Event()
    alone = [asyncio.create_task(_section(gate, "a", log, release, peak)) for _ in range(6)]
    await asyncio.sleep(0)
    presence.arrive("b")
    shared = [asyncio.create_task(_section(gate, "a", log, release, peak)) for _ in range(6)]
    shared.append(asyncio.create_task(_section(gate, "b", log, release, peak)))
    await asyncio.sleep(0)
    assert log == ["a"] * 8  # the six loose ones and the limit's two: b's waits for the first place to free
    assert (gate.loose, len(gate)) == (6, 5)
    release.set()
    await asyncio.gather(*alone, *shared)
    assert log.index("b") < 10 and (gate.running, len(gate)) == (0, 0)


async def test_a_tenant_below_its_share_starts_at_once_beside_a_loose_backlog() -> None:
    presence = present("a")
    gate, log, peak, release = FairGate(4, headroom=0.25, presence=presence), [], [0], asyncio.Event()
    tasks = [asyncio.create_task(_section(gate, "a", log, release, peak)) for _ in range(20)]
    await asyncio.sleep(0)
    presence.arrive("b")
    tasks.append(asyncio.create_task(_section(gate, "b", log, release, peak)))
    await asyncio.sleep(0)
    assert log == ["a"] * 20 + ["b"]  # a's loose sections are not the bounded ones b is measured against
    release.set()
    await asyncio.gather(*tasks)


def test_presence_counts_held_messages_per_tenant_and_a_tenant_gone_lingers() -> None:
    now = [100.0]
    presence = Presence(linger_s=1.0, clock=lambda: now[0])
    assert not presence.others("a")
    presence.arrive("a")
    presence.arrive("a")
    assert not presence.others("a") and presence.others("b")
    presence.arrive("b")
    assert presence.others("a")
    presence.leave("b")
    now[0] += 0.5
    assert presence.others("a")  # b's last message was handled half a second ago: its next may be on its way
    now[0] += 0.6
    assert not presence.others("a")
    presence.leave("a")
    assert presence.others("b")
    presence.leave("a")
    assert presence.others("b") and not presence.others("a")  # a lingers too, for another tenant
    now[0] += 2
    assert not presence.others("b")
