"""A turn's budget decision is asked for as soon as the transaction that schedules the turn is applied,
while it is saved, so the governor's round trip overlaps the save's instead of following it (issue 8),
and the turn uses that early answer only when it starts from the very state it was asked on, saved.

Against the session's real NATS server and governor: a planner under test (its own bus, not
subscribed to anything) stores a run and asks early; every budget request on the wire is watched
with a plain subscription. A full scripted run through the stack's planner asks once per turn: the
early answer is used by the replica that asked, and asked for at most once more when
the other replica runs the turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from loopwarden.client import Client, new_run_id
from loopwarden.stack import LocalStack
from services.planner import ids
from services.planner.handlers import Planner
from services.planner.outbox import Outbox, advance
from services.planner.state import RunState
from services.planner.turns import resolve_config, start_run
from shared import subjects as S
from shared.bus import Bus
from shared.messages import BudgetRequest, RunSubmit
from shared.telemetry import setup_telemetry
from tests.support.runs import run_scenario
from tests.support.stacks import settings_for
from tests.support.timing import bound


@dataclass
class Asked:
    """Budget requests seen on the wire, per run: (turn, spent input tokens)."""

    turns: dict[str, list[int]] = field(default_factory=dict)

    def of(self, run_id: str) -> list[int]:
        return self.turns.get(run_id, [])


@pytest.fixture
async def asked(client: Client) -> AsyncIterator[Asked]:
    seen = Asked()

    async def note(msg: object) -> None:
        req = BudgetRequest.model_validate_json(msg.data)  # type: ignore[attr-defined]
        seen.turns.setdefault(req.run_id, []).append(req.turn)

    sub = await client.bus.nc.subscribe(S.BUDGET_RESERVE, cb=note)  # no queue group: sees every request
    yield seen
    await sub.unsubscribe()


@pytest.fixture
async def planner(stack: LocalStack) -> AsyncIterator[Planner]:
    settings = settings_for(stack)
    bus = Bus(settings, "planner-under-test")
    await bus.connect()
    try:
        yield Planner(bus, settings, setup_telemetry("planner-under-test", settings))
    finally:
        await bus.stop()


async def started(planner: Planner) -> tuple[RunState, Outbox]:
    """A run stored as ``on_submit`` stores it (its outbox carries the advance to turn 1), not published."""
    contracts = await planner.contracts()
    submit = RunSubmit(run_id=new_run_id(), task="Add two numbers.")
    out = start_run(submit, resolve_config(submit, planner.settings, contracts), [])
    out.state.remember(ids.SUBMIT, out.items)
    await planner.store.create(out.state)
    return out.state, out


async def settled(client: Client) -> None:
    await client.bus.nc.flush()
    await asyncio.sleep(bound(0.2))  # the watching subscription's callbacks run


async def test_the_early_decision_is_used_by_its_turn_without_asking_again(
    planner: Planner, client: Client, asked: Asked
) -> None:
    state, out = await started(planner)
    planner.turns.prefetch(state, out.items)
    planner.turns.prefetch_saved(state)
    early = planner.turns.prefetched[state.run_id]
    decision, planned = await planner.turns.reserve(state, await planner.contracts())
    await settled(client)
    assert asked.of(state.run_id) == [1]  # asked once, when the turn was scheduled
    assert decision == await early.decision and planned is early.planned
    assert state.run_id not in planner.turns.prefetched  # used once


async def test_a_stale_early_decision_is_not_used_and_the_turn_asks_again_getting_the_same_answer(
    planner: Planner, client: Client, asked: Asked
) -> None:
    state, out = await started(planner)
    planner.turns.prefetch(state, out.items)
    planner.turns.prefetch_saved(state)
    early = await planner.turns.prefetched[state.run_id].decision

    def note(s: RunState | None) -> tuple[RunState, None]:  # another message moved the run meanwhile
        assert s is not None
        s.warnings.append("something else happened")
        return s, None

    await planner.store.update(state.run_id, note)
    now = await planner.store.load(state.run_id)
    assert now is not None
    decision, planned = await planner.turns.reserve(now, await planner.contracts())
    await settled(client)
    assert asked.of(state.run_id) == [1, 1]  # the turn asked again ...
    assert decision == early  # ... and the governor answered as it did: once per (run, turn)
    assert planned.messages == now.messages


async def test_an_early_decision_asked_for_a_state_that_was_not_saved_is_not_used(
    planner: Planner, client: Client, asked: Asked
) -> None:
    """The early ask goes out before the transaction's save; a save that did not happen (a conflict,
    a crash) leaves it unused: the turn asks again, and the governor answers as it did."""
    state, out = await started(planner)
    planner.turns.prefetch(state, out.items)
    early = await planner.turns.prefetched[state.run_id].decision
    decision, _ = await planner.turns.reserve(state, await planner.contracts())
    await settled(client)
    assert asked.of(state.run_id) == [1, 1] and decision == early


async def test_only_an_advance_to_the_runs_current_turn_is_asked_for_early(
    planner: Planner, client: Client, asked: Asked
) -> None:
    state, out = await started(planner)
    planner.turns.prefetch(state, [i for i in out.items if i.subject != S.RUN_ADVANCE])  # no turn scheduled
    other = Outbox(state.model_copy())
    other.state.iteration = other.state.iteration.model_copy(update={"n": 7})
    advance(other)
    planner.turns.prefetch(state, other.items)  # an advance to a turn the stored state is not at
    state.status = "awaiting_human"
    planner.turns.prefetch(state, out.items)  # the run is not running
    await settled(client)
    assert state.run_id not in planner.turns.prefetched and asked.of(state.run_id) == []


async def test_a_scripted_run_on_two_planner_replicas_asks_at_most_twice_per_turn(client: Client, asked: Asked) -> None:
    steps = 6
    final = await run_scenario(
        client,
        {
            "name": "prefetched-budget",
            "task": "Add up.",
            "planner": [
                *({"tool_calls": [{"name": "calculator", "input": {"expression": f"{i} + 1"}}]} for i in range(steps)),
                {"text": "Done: the sums are computed."},
            ],
        },
    )
    assert final.status == "completed", final.final_reason
    await settled(client)
    # Every turn was asked for, the early answer is not asked for again when its turn uses it, and at
    # most once more when another replica ran the turn (the session stack runs two planners).
    turns = asked.of(final.run_id)
    assert sorted(set(turns)) == list(range(1, steps + 2))
    assert all(turns.count(t) <= 2 for t in turns), turns
