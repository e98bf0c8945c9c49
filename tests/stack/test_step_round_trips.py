"""The edge of a step - the executor and the governor - makes no round trip on the step's path
that its guarantees do not need.

Observed on the server, as a plain NATS subscriber sees what the services send (the real stack,
nothing wrapped): the executor claims a non-idempotent call with one create and records its final
in one more write, reading the ledger only when the create finds the call there already (a
redelivery, driven end to end by tests/stack/test_exactly_once.py); an idempotent call's first delivery
writes only its final, with a create; the governor answers a budget request before it shares its
calibration, which it still does.
"""

from __future__ import annotations

import asyncio

from loopwarden.client import Client
from services.governor.handlers import CALIBRATION_KEY, Calibration
from shared import subjects as S
from shared.scenario import parse_scenario
from tests.support.runs import calculator_steps
from tests.support.timing import bound, polls
from tests.support.wire import Seen, Wire

CREATE_HEADER = "Nats-Expected-Last-Subject-Sequence"


def ledger_writes(wire: Wire, run_id: str) -> dict[str, list[Seen]]:
    """Per ledger key of the run, what was written to it (no ledger read is allowed on a first delivery)."""
    ledger = f"$KV.{S.KV_TOOL_LEDGER}."
    mine = [m for m in wire.seen if run_id in m.subject]
    reads = [m.subject for m in mine if m.subject.startswith("$JS.API.")]
    assert reads == [], f"the ledger was read on a first delivery: {reads}"
    writes: dict[str, list[Seen]] = {}
    for m in mine:
        writes.setdefault(m.subject.removeprefix(ledger), []).append(m)
    return writes


async def test_a_first_delivery_claims_a_non_idempotent_call_with_one_create_and_reads_nothing(
    client: Client,
) -> None:
    ledger = f"$KV.{S.KV_TOOL_LEDGER}."
    charge = {"customer_id": "cus_once1", "amount_cents": 300, "currency": "eur"}
    scenario = {
        "name": "one-create-charge",
        "task": "Charge 3 EUR once, then say done.",
        "planner": [{"tool_calls": [{"name": "charge_card", "input": charge}]}, {"text": "done"}],
        "answer_mode": "text",
    }
    async with Wire(client, f"{ledger}>", f"$JS.API.DIRECT.GET.KV_{S.KV_TOOL_LEDGER}.>") as wire:
        run_id = await client.submit_scenario(parse_scenario(scenario))
        state = await client.wait(run_id, timeout=bound(30))
    assert state.status == "completed", state.final_reason
    writes = ledger_writes(wire, run_id)
    assert len(writes) == 1, list(writes)
    (entries,) = writes.values()
    # created (expected revision 0: it must not exist) before the tool runs, then the final, under CAS
    assert len(entries) == 2, [e.data for e in entries]
    assert entries[0].headers.get(CREATE_HEADER) == "0"
    assert entries[1].headers.get(CREATE_HEADER, "0") != "0"
    assert b'"final"' not in entries[0].data and b'"final":{' in entries[1].data  # no final yet: left out


async def test_an_idempotent_call_is_not_claimed_its_final_is_created(client: Client) -> None:
    ledger = f"$KV.{S.KV_TOOL_LEDGER}."
    async with Wire(client, f"{ledger}>", f"$JS.API.DIRECT.GET.KV_{S.KV_TOOL_LEDGER}.>") as wire:
        run_id = await client.submit_scenario(parse_scenario(calculator_steps("one-create", 3)))
        state = await client.wait(run_id, timeout=bound(30))
    assert state.status == "completed", state.final_reason
    writes = ledger_writes(wire, run_id)
    assert len(writes) == 3, list(writes)  # one entry per call
    for key, entries in writes.items():
        # running it again is harmless: no claim before it runs, the final is written with a create
        assert len(entries) == 1, (key, [e.data for e in entries])
        assert entries[0].headers.get(CREATE_HEADER) == "0" and b'"final":{' in entries[0].data
    # a first attempt that returns its output publishes no attempt event: the outcome counts it
    events = await client.events(run_id)
    assert [e.kind for e in events if e.kind.startswith("tool.attempt.")] == []
    assert [e.payload["attempts"] for e in events if e.kind == "tool.succeeded.calculator"] == [1, 1, 1]


async def test_a_budget_answer_does_not_wait_for_the_shared_calibration(one_client: Client) -> None:
    # one replica of each: one run's budget requests come one after another (on the shared stack a turn
    # may be asked by both planner replicas at once, and an answer's calibration write may land inside
    # the other ask's window without anything having waited for it)
    client = one_client
    # the governor reads the shared ratios once, before its first answer: that read is not the sharing
    warm = await client.submit_scenario(parse_scenario(calculator_steps("calibration-warm-up", 1)))
    assert (await client.wait(warm, timeout=bound(30))).status == "completed"
    shared_key = f"$KV.{S.KV_BUDGETS}.{CALIBRATION_KEY}"
    async with Wire(
        client,
        S.BUDGET_RESERVE,
        f"{S.inbox_prefix('planner')}.>",
        shared_key,
        f"$JS.API.DIRECT.GET.KV_{S.KV_BUDGETS}.{shared_key}",
    ) as wire:
        # 12 turns: the governor shares its ratios after 8 samples (at most once a second: waited for here)
        run_id = await client.submit_scenario(parse_scenario(calculator_steps("calibration-aside", 11)))
        state = await client.wait(run_id, timeout=bound(30))
        for _ in range(polls(40)):
            if any(m.subject == shared_key for m in wire.seen):
                break
            await asyncio.sleep(0.1)
    assert state.status == "completed", state.final_reason
    asked = {m.reply: i for i, m in enumerate(wire.seen) if m.subject == S.BUDGET_RESERVE and run_id.encode() in m.data}
    answered = {m.subject: i for i, m in enumerate(wire.seen) if m.subject in asked}
    assert len(asked) == 12 and asked.keys() == answered.keys(), len(asked)  # one planner: one ask per turn
    shared = [i for i, m in enumerate(wire.seen) if m.subject in (shared_key, wire.subjects[3])]
    assert shared, "the governor did not share its calibration during 12 turns"
    for inbox, at in asked.items():
        between = [i for i in shared if at < i < answered[inbox]]
        assert between == [], f"a budget answer waited for the calibration ({len(between)} operations)"
    stored, _ = await client.bus.kv_get(S.KV_BUDGETS, CALIBRATION_KEY, Calibration)
    assert stored is not None and state.model in stored.ratios, stored
