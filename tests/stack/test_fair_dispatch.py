"""Fair dispatch inside a consumer, against a real nats-server (``shared/bus/fair.py``, ``docs/flow-control.md``):
a replica holds messages beyond its free slots and gives a slot that frees to the tenant holding fewest; the
tenant travels on every message (``Lw-Tenant``), set by the planner for a run and carried on by every handler;
messages held for a slot are still heartbeaten, and handled or handed back when the replica stops."""

from __future__ import annotations

import asyncio
import os

import nats
import pytest
from nats.aio.msg import Msg

from loopwarden.client import Client
from loopwarden.stack import LocalStack
from shared import subjects as S
from shared.bus import TENANT_HEADER, TENANT_WEIGHT_HEADER, Bus, FairGate, current_deliveries, tenant_scope
from shared.messages import RunAdvance
from shared.scenario import parse_scenario
from shared.settings import Settings
from tests.support.timing import bound, eventually

HOLD_S = 0.15  # each message's handler


def fair_bus(stack: LocalStack, name: str, lookahead: int, **more: object) -> Bus:
    fields: dict[str, object] = {
        "ack_wait_s": 3,
        "max_in_flight": 2,
        "dispatch_lookahead": lookahead,
        "dispatch_headroom": 0,
        "max_ack_pending": 100,  # the default, 8 x the slots, would let the server hand out only 16 at a time
        **more,
    }
    settings = Settings(nats_url=str(stack.nats_url), **fields)  # type: ignore[arg-type]
    return Bus(settings, name)


@pytest.mark.parametrize("lookahead", [40, 0])
async def test_a_tenants_messages_fetched_behind_another_tenants_backlog_are_handled_next(
    stack: LocalStack, lookahead: int
) -> None:
    """Tenant a's 30 messages are in the durable before tenant b's 3, the replica has 2 slots. With a lookahead it
    holds them all, and once a slot frees b holds one of the two (its share) until its 3 are done; without one
    (first come, first served) b's come after a's 30."""
    marker = os.urandom(4).hex()
    subject = S.tool_execute(f"test_fair_{marker}")
    bus = fair_bus(stack, "fairtest", lookahead)
    order: list[str] = []
    done = asyncio.Event()

    @bus.consumer(durable=f"fairtest_{marker}", filter_subjects=[subject], model=RunAdvance)
    async def on_msg(ev: RunAdvance) -> None:
        order.append(ev.run_id)
        await asyncio.sleep(HOLD_S)
        if len(order) == 33:
            done.set()

    await bus.connect()
    try:
        with tenant_scope("a"):
            for i in range(30):
                await bus.publish(subject, RunAdvance(run_id=f"a-{marker}-{i}", iteration=0))
        with tenant_scope("b"):
            for i in range(3):
                await bus.publish(subject, RunAdvance(run_id=f"b-{marker}-{i}", iteration=0))
        await bus.start()
        await asyncio.wait_for(done.wait(), bound(60))
    finally:
        await bus.stop()
    places = [n for n, run in enumerate(order) if run.startswith("b-")]
    if lookahead:
        assert places == [2, 4, 6], f"b's messages handled at {places} of 33"  # a had both slots when b came
    else:
        assert places == [30, 31, 32]


async def test_what_a_handler_publishes_carries_on_the_tenant_of_the_message_it_handles(stack: LocalStack) -> None:
    marker = os.urandom(4).hex()
    first, then = S.tool_execute(f"test_carry_{marker}"), S.tool_execute(f"test_carried_{marker}")
    bus = fair_bus(stack, "carrytest", 2)
    seen: list[dict[str, str]] = []

    @bus.consumer(durable=f"carrytest_{marker}", filter_subjects=[first], model=RunAdvance)
    async def on_msg(ev: RunAdvance) -> None:
        await bus.publish(then, RunAdvance(run_id=ev.run_id, iteration=1))

    async def on_then(msg: Msg) -> None:
        seen.append(dict(msg.headers or {}))

    await bus.connect()
    try:
        await bus.nc.subscribe(then, cb=on_then)
        await bus.start()
        with tenant_scope("acme", weight=3):
            await bus.publish(first, RunAdvance(run_id=f"run-{marker}", iteration=0))
        await bus.publish(first, RunAdvance(run_id=f"run-{marker}-none", iteration=0))  # no tenant: none carried
        await eventually(lambda: len(seen) == 2, what="both carried on", within=bound(10))
    finally:
        await bus.stop()
    carried = {h.get("Lw-Run-Id"): (h.get(TENANT_HEADER), h.get(TENANT_WEIGHT_HEADER)) for h in seen}
    assert carried == {f"run-{marker}": ("acme", "3"), f"run-{marker}-none": (None, None)}


async def test_messages_held_for_a_slot_outlive_the_ack_wait_and_are_not_redelivered(stack: LocalStack) -> None:
    """One slot, ten messages held, each handler 0.5 s: the last waits about 5 s for its slot, past the 3 s ack
    wait. The heartbeat covers held messages too: every one is handled once, on its first delivery."""
    marker = os.urandom(4).hex()
    subject = S.tool_execute(f"test_held_{marker}")
    bus = fair_bus(stack, "heldtest", 20, max_in_flight=1)
    seen: dict[str, list[int]] = {}

    @bus.consumer(durable=f"heldtest_{marker}", filter_subjects=[subject], model=RunAdvance)
    async def on_msg(ev: RunAdvance) -> None:
        seen.setdefault(ev.run_id, []).append(current_deliveries())
        await asyncio.sleep(0.5)

    await bus.connect()
    try:
        names = [f"held-{marker}-{i}" for i in range(10)]
        for name in names:
            await bus.publish(subject, RunAdvance(run_id=name, iteration=0), msg_id=name)
        await bus.start()
        await eventually(lambda: len(seen) == 10, what="all ten handled", within=bound(30))
        await asyncio.sleep(1.0)  # any redelivery would come now
    finally:
        await bus.stop()
    assert seen == {name: [1] for name in names}


async def test_a_message_is_heartbeaten_when_its_ack_wait_needs_it_not_at_every_tick(stack: LocalStack) -> None:
    """120 messages through 2 slots (0.1 s each) with 8 held beyond them: each is held about 0.5 s, far less than a
    third of the 9 s ack wait, so none is heartbeaten (a tick heartbeating every held message sent one to each of
    the ~10 held at the time); one held 5 s, past a third of it and the tick after, is heartbeaten."""
    marker = os.urandom(4).hex()
    subject = S.tool_execute(f"test_beat_{marker}")
    durable = f"beattest_{marker}"
    bus = fair_bus(stack, "beattest", 8, ack_wait_s=9)
    seen: dict[str, list[int]] = {}
    long = f"beat-{marker}-long"

    @bus.consumer(durable=durable, filter_subjects=[subject], model=RunAdvance)
    async def on_msg(ev: RunAdvance) -> None:
        seen.setdefault(ev.run_id, []).append(current_deliveries())
        await asyncio.sleep(5.0 if ev.run_id == long else 0.1)

    beats: list[str] = []

    async def on_ack(msg: Msg) -> None:
        if msg.data == b"+WPI":
            beats.append(msg.subject)

    watcher = await nats.connect(str(stack.nats_url))
    await watcher.subscribe(f"$JS.ACK.*.{durable}.>", cb=on_ack)
    await bus.connect()
    try:
        names = [f"beat-{marker}-{i}" for i in range(120)]
        for name in names:
            await bus.publish(subject, RunAdvance(run_id=name, iteration=0), msg_id=name)
        await bus.start()
        await eventually(lambda: len(seen) == 120, what="all handled", within=bound(60))
        await watcher.flush()
        assert beats == [], f"{len(beats)} heartbeats for messages handled well within a third of the ack wait"
        await bus.publish(subject, RunAdvance(run_id=long, iteration=0), msg_id=long)
        await eventually(lambda: long in seen, what="the long one started", within=bound(10))
        await eventually(lambda: len(beats) >= 1, what="the long one heartbeaten", within=bound(10))
    finally:
        await bus.stop()
        await watcher.close()
    assert all(deliveries == [1] for deliveries in seen.values())


@pytest.mark.parametrize("yield_share", [True, False])
async def test_with_yield_a_backlog_runs_no_more_than_its_share_beside_another_tenant(
    stack: LocalStack, yield_share: bool
) -> None:
    """``LW_DISPATCH_YIELD``: 4 slots, a's 30 messages (0.2 s each) and then b's one (1.5 s): while b's runs, a runs
    at most 2 (its share of two tenants) with it on; without it a takes back every slot but b's."""
    marker = os.urandom(4).hex()
    subject = S.tool_execute(f"test_yield_{marker}")
    bus = fair_bus(stack, "yieldtest", 40, max_in_flight=4, dispatch_headroom=0.5, dispatch_yield=yield_share)
    running: dict[str, int] = {"a": 0, "b": 0}
    beside_b: list[int] = []  # a's running count each time one of a's starts while b runs
    done = asyncio.Event()
    handled = 0

    @bus.consumer(durable=f"yieldtest_{marker}", filter_subjects=[subject], model=RunAdvance)
    async def on_msg(ev: RunAdvance) -> None:
        nonlocal handled
        tenant = ev.run_id.split("-")[0]
        running[tenant] += 1
        if tenant == "a" and running["b"]:
            beside_b.append(running["a"])
        await asyncio.sleep(1.5 if tenant == "b" else 0.2)
        running[tenant] -= 1
        handled += 1
        if handled == 31:
            done.set()

    await bus.connect()
    try:
        with tenant_scope("a"):
            for i in range(30):
                await bus.publish(subject, RunAdvance(run_id=f"a-{marker}-{i}", iteration=0))
        with tenant_scope("b"):
            await bus.publish(subject, RunAdvance(run_id=f"b-{marker}", iteration=0))
        await bus.start()
        await asyncio.wait_for(done.wait(), bound(60))
    finally:
        await bus.stop()
    assert beside_b, "none of a's started while b's ran"
    if yield_share:
        assert max(beside_b) <= 2, beside_b
    else:
        assert max(beside_b) == 3, beside_b  # every slot but b's


async def test_a_handled_message_is_acked_though_its_replica_writes_nothing_after_it(stack: LocalStack) -> None:
    """An ack waits for the connection's next write (``acks.ACK_LINGER_S``), and a replica that has nothing
    more to write sends it alone: the server holds no ack pending soon after the handler returns, and the message
    is not delivered again once its ack wait has passed."""
    marker = os.urandom(4).hex()
    subject = S.tool_execute(f"test_lone_{marker}")
    durable = f"lonetest_{marker}"
    # 16 slots: the pull request the freed slot would send (another write) waits for a quarter of them free
    bus = fair_bus(stack, "lonetest", 0, ack_wait_s=1, max_in_flight=16)
    seen: list[int] = []

    @bus.consumer(durable=durable, filter_subjects=[subject], model=RunAdvance)
    async def on_msg(ev: RunAdvance) -> None:
        seen.append(current_deliveries())

    watcher = await nats.connect(str(stack.nats_url))  # asked on a connection of its own: a write on the bus's
    await bus.connect()  # connection would carry the ack out with it
    try:
        await bus.publish(subject, RunAdvance(run_id=f"lone-{marker}", iteration=0), msg_id=f"lone-{marker}")
        await bus.start()
        await eventually(lambda: len(seen) == 1, what="the message handled", within=bound(10))

        async def acked() -> bool:
            info = await watcher.jetstream().consumer_info(S.stream_for(subject), durable)
            return info.num_ack_pending == 0

        await eventually(acked, what="its ack at the server", within=bound(0.5))
        await asyncio.sleep(2.5)  # past two ack waits: a message never acked would have come again
    finally:
        await bus.stop()
        await watcher.close()
    assert seen == [1]


async def test_a_replica_stopping_with_messages_held_hands_back_what_it_cannot_handle_in_its_grace(
    stack: LocalStack,
) -> None:
    """Replica A holds ten messages for its one slot, each 1 s, and stops (grace: 3 s, the ack wait): it handles
    what it can, hands back the rest at once, and replica B handles those. Every message is handled exactly once."""
    marker = os.urandom(4).hex()
    subject = S.tool_execute(f"test_stophold_{marker}")
    durable = f"stopholdtest_{marker}"
    a, b = fair_bus(stack, "stopholdtest", 20, max_in_flight=1), fair_bus(stack, "stopholdtest", 0)
    started: list[str] = []
    by_a: list[str] = []
    by_b: dict[str, int] = {}

    @a.consumer(durable=durable, filter_subjects=[subject], model=RunAdvance)
    async def on_a(ev: RunAdvance) -> None:
        started.append(ev.run_id)
        await asyncio.sleep(1.0)
        by_a.append(ev.run_id)  # handled (one cut off by the end of the grace is handed back, not handled)

    @b.consumer(durable=durable, filter_subjects=[subject], model=RunAdvance)
    async def on_b(ev: RunAdvance) -> None:
        by_b[ev.run_id] = current_deliveries()

    await a.connect()
    await b.connect()
    names = [f"stophold-{marker}-{i}" for i in range(10)]
    try:
        for name in names:
            await a.publish(subject, RunAdvance(run_id=name, iteration=0), msg_id=name)
        await a.start()
        await eventually(lambda: len(started) == 1, what="A busy", within=bound(10))
        await a.stop()
        assert 2 <= len(by_a) <= 5, f"A handled {len(by_a)} in its grace"
        await b.start()
        await eventually(lambda: len(by_a) + len(by_b) == 10, what="the rest handled by B", within=bound(20))
        await asyncio.sleep(0.5)
    finally:
        await b.stop()
    assert sorted(by_a + list(by_b)) == sorted(names)  # each once
    assert set(by_b.values()) == {2}  # handed back: one delivery more, not a crash
    assert len(started) <= len(by_a) + 1  # held ones were not started past the grace


async def test_the_planner_writes_the_runs_tenant_on_its_commands_and_the_executor_carries_it_on(
    client: Client,
) -> None:
    scenario = parse_scenario(
        {
            "name": "carried-tenant",
            "task": "Add, then say done.",
            "planner": [
                {"tool_calls": [{"name": "calculator", "input": {"expression": "2+2"}}]},
                {"text": "done"},
            ],
            "answer_mode": "text",
        }
    )
    headers: dict[str, str | None] = {}
    run_id = ""

    async def on_msg(msg: Msg) -> None:
        if (msg.headers or {}).get("Lw-Run-Id") == run_id:
            headers.setdefault(S.stem(msg.subject).split(".")[3], (msg.headers or {}).get(TENANT_HEADER))

    subs = [await client.bus.nc.subscribe(f"{S.P}.{kind}.>", cb=on_msg) for kind in ("cmd.tool", "cmd.result")]
    try:
        run_id = await client.submit_scenario(scenario)
        state = await client.wait(run_id, timeout=bound(30))
    finally:
        for sub in subs:
            await sub.unsubscribe()
    assert state.status == "completed"
    tenant = state.tenant or S.DEFAULT_TENANT
    # the planner's tool call, and the executor's result for the validator
    assert headers == {"tool": tenant, "result": tenant}


async def test_a_commit_gate_bounds_a_tenant_only_while_another_tenant_has_messages_in_the_replica(
    stack: LocalStack,
) -> None:
    """The planner's commit gate (``FairGate`` on the bus's ``presence``): with tenant a's messages alone in the
    replica, every handler's section runs at once; once tenant b's message is held there, b's section starts at
    once and a's next ones are bounded (the gate's limit, 2: one beside b's), the rest waiting for a place."""
    marker = os.urandom(4).hex()
    subject = S.tool_execute(f"test_gate_{marker}")
    bus = fair_bus(stack, "gatetest", 40, max_in_flight=20)
    gate = FairGate(2, headroom=0, presence=bus.presence)
    release, seen = asyncio.Event(), []

    @bus.consumer(durable=f"gatetest_{marker}", filter_subjects=[subject], model=RunAdvance)
    async def on_msg(ev: RunAdvance) -> None:
        async with gate.section():
            seen.append(ev.run_id)
            await release.wait()

    async def publish(tenant: str, ids: range) -> None:
        with tenant_scope(tenant):
            for i in ids:
                await bus.publish(subject, RunAdvance(run_id=f"{tenant}-{marker}-{i}", iteration=0))

    await bus.connect()
    try:
        await bus.start()
        await publish("a", range(8))
        await eventually(lambda: len(seen) == 8, what="a's eight sections running at once", within=bound(10))
        assert (gate.loose, len(gate)) == (8, 0)
        await publish("b", range(1))
        await eventually(lambda: len(seen) == 9, what="b's section running", within=bound(10))
        await publish("a", range(8, 16))
        await eventually(lambda: len(seen) == 10, what="a's next section beside b's", within=bound(10))
        await eventually(lambda: len(gate) == 7, what="a's other seven waiting", within=bound(10))
        await asyncio.sleep(0.3)
        assert (len(seen), gate.loose, gate.running) == (10, 8, 10)
        release.set()
        await eventually(lambda: len(seen) == 17, what="every message handled", within=bound(10))
    finally:
        await bus.stop()
    assert seen[8] == f"b-{marker}-0"
