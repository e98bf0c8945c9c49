"""The edge of a step - the executor and the governor - makes no round trip on the step's path
that its guarantees do not need (nor the governor one per step for a tenant's day that nobody awaits).

Observed on the server, as a plain NATS subscriber sees what the services send (the real stack,
nothing wrapped): the executor claims a non-idempotent call with one create and records its final
in one more write, reading the ledger only when the create finds the call there already (a
redelivery, driven end to end by tests/stack/test_exactly_once.py); an idempotent call's first delivery
writes only its final, with a create; the governor answers a budget request before it shares its
calibration, which it still does. An idempotent call's final leaves beside its create; a batch of
keys (a step's history) is refused whole when one key is not valid.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
from nats.aio.msg import Msg

from loopwarden.client import Client
from loopwarden.stack import LocalStack
from services.governor.budget import BudgetLedger
from services.governor.handlers import CALIBRATION_KEY, Calibration
from shared import subjects as S
from shared.flow import day_key, today
from shared.messages import BudgetDecision, BudgetRequest, SectionTokens, ToolCall, Usage
from shared.scenario import parse_scenario
from tests.support.reads import tenant_spent
from tests.support.runs import calculator_steps
from tests.support.stacks import TEST_ENV, running, settings_for
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


# --- an idempotent call's final leaves with its create ------------------------------------------------


async def test_an_idempotent_calls_final_is_published_beside_its_create_not_after_its_answer(client: Client) -> None:
    ledger = f"$KV.{S.KV_TOOL_LEDGER}."
    inbox = f"{S.inbox_prefix('executor')}.>"
    async with Wire(client, f"{ledger}>", S.RESULT_VALIDATE, inbox) as wire:
        run_id = await client.submit_scenario(parse_scenario(calculator_steps("early-final", 5)))
        state = await client.wait(run_id, timeout=bound(30))
    assert state.status == "completed", state.final_reason
    seen = wire.seen
    creates = [i for i, m in enumerate(seen) if m.subject.startswith(ledger) and run_id in m.subject]
    assert len(creates) == 5, len(creates)
    early = 0
    for i in creates:
        attempt = seen[i].subject.removeprefix(ledger)
        # (the final may even reach the server first: a replica's first write to the ledger looks the bucket up)
        published = next(j for j, m in enumerate(seen) if m.subject == S.RESULT_VALIDATE and attempt.encode() in m.data)
        answered = next((j for j in range(i + 1, len(seen)) if seen[j].subject == seen[i].reply), None)
        if answered is None:  # the answer did not reach this subscriber (a loaded machine): this create says nothing
            continue
        early += published < answered  # published before the create was answered: it did not wait for it
    # a publish made after the create's answer can never come before it; sent together, it does (the server
    # may still answer the create before it reads the publish from the same write, now and then)
    assert early >= 1, "every final was published only after its create was answered"


async def test_a_second_delivery_of_a_finished_idempotent_call_lets_the_recorded_final_count(client: Client) -> None:
    from services.planner import ids

    run_id = await client.submit_scenario(parse_scenario(calculator_steps("adopt-final", 1)))
    state = await client.wait(run_id, timeout=bound(30))
    assert state.status == "completed", state.final_reason
    call_id = "toolu_001_01"
    attempt = ids.attempt(run_id, 1, call_id)
    again = ToolCall(
        run_id=run_id,
        iteration=1,
        call_id=call_id,
        attempt_id=attempt,
        tool="calculator",
        requested_tool="calculator",
        arguments={"expression": "0+1"},
    )
    async with Wire(client, S.RESULT_VALIDATE) as wire:
        # the same call delivered afresh (another message id): it runs (idempotent, unclaimed), its create finds
        # the recorded final, and that final counts; what it publishes carries the same message id
        await client.bus.publish(S.tool_execute("calculator"), again, msg_id=f"again-{attempt}")
        for _ in range(polls(100)):
            if sum(attempt.encode() in m.data for m in wire.seen) >= 2:
                break
            await asyncio.sleep(0.05)
    published = [m for m in wire.seen if attempt.encode() in m.data]
    assert len(published) >= 2, len(published)  # its own final beside the create, then the recorded one
    assert {m.headers.get("Nats-Msg-Id") for m in published} == {f"{attempt}.raw"}
    history = await (await client.bus.kv(S.KV_TOOL_LEDGER)).history(attempt)
    assert len(history) == 1  # the first delivery's create, never written again
    await asyncio.sleep(bound(0.5))
    kinds = [e.kind for e in await client.events(run_id)]
    assert kinds.count("tool.succeeded.calculator") == 1, kinds  # the stream kept one result: validated once


# --- a tenant's day without a ceiling: written now and then, never read first -------------------------


@pytest.fixture(scope="module")
def no_ceilings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """The services on a step's path, and no tenant with a daily ceiling (the shared stack gives every one)."""
    env = {k: v for k, v in TEST_ENV.items() if k != "LW_TENANT_DAILY_CEILING_USD"} | {"LW_TENANT_CEILINGS": "{}"}
    services = ("planner", "executor", "validator", "governor")
    yield from running(LocalStack(state_dir=tmp_path_factory.mktemp("no-ceilings"), env=env, services=services))


async def test_a_tenant_without_a_ceiling_has_its_day_written_now_and_then_not_at_every_turn(
    no_ceilings: LocalStack,
) -> None:
    tenant = S.DEFAULT_TENANT  # the runs submitted without one (this stack runs no other)
    day = f"$KV.{S.KV_BUDGETS}.{day_key(tenant, today())}"
    async with Client(settings_for(no_ceilings)) as client:
        async with Wire(client, day, f"$JS.API.DIRECT.GET.KV_{S.KV_BUDGETS}.{day}") as wire:
            run_id = await client.submit_scenario(parse_scenario(calculator_steps("day-aside", 11)))
            state = await client.wait(run_id, timeout=bound(30))
            spent = await tenant_spent(client, tenant, state.usage.cost_usd)
    assert state.status == "completed", state.final_reason
    assert state.usage.cost_usd > 0 and spent == state.usage.cost_usd  # the run's final total, settled
    writes = [m for m in wire.seen if m.subject == day]
    reads = [m for m in wire.seen if m.subject != day and m.reply.startswith(S.inbox_prefix("governor"))]
    assert 1 <= len(writes) < 12, len(writes)  # 12 turns asked about: their spend gathered into fewer writes
    assert len(reads) <= 1, len(reads)  # read once at most (the replica's first write of the day): then kept


async def test_a_batch_of_keys_with_one_invalid_key_writes_none_of_them(client: Client) -> None:
    from nats.js.errors import InvalidKeyError

    from shared.messages import ChatMessage

    run_id = f"run-batch-{uuid.uuid4().hex[:8]}"
    first, second, bad = S.kv_key(run_id, "0"), S.kv_key(run_id, "1"), f"{run_id}.bad key"
    a, b = ChatMessage.user("a"), ChatMessage.user("b")
    with pytest.raises(InvalidKeyError):
        await client.bus.kv_put_all(S.KV_HISTORY, [(first, a), (bad, b)])
    stored, _ = await client.bus.kv_get(S.KV_HISTORY, first, ChatMessage)
    assert stored is None  # refused before anything was sent
    headers: list[object] = []

    async def seen(msg: Msg) -> None:
        headers.append(msg.headers)

    sub = await client.bus.nc.subscribe(f"$KV.{S.KV_HISTORY}.{run_id}.>", cb=seen)
    await client.bus.kv_put_all(S.KV_HISTORY, [(first, a), (second, b)])
    read = [(await client.bus.kv_get(S.KV_HISTORY, key, ChatMessage))[0] for key in (first, second)]
    await sub.unsubscribe()
    assert read == [a, b]
    assert headers == [None, None]  # stored as a plain put stores them: no (empty) header block


# --- the door: a run that starts at once ----------------------------------------------------------------


async def test_a_run_started_at_the_door_reads_no_ticket_and_its_first_turn_reads_no_scenario(
    one_client: Client,
) -> None:
    """Nothing waits in the fleet: the submit starts at the door, in the write that counts it. No waiting ticket is
    read for it (it has none), its scenario is bound once, and the planner that bound it takes the first turn
    without reading it back (one planner here: it is that one)."""
    client = one_client
    run_id = f"run-door-{uuid.uuid4().hex[:12]}"
    tickets = f"$JS.API.DIRECT.GET.{S.STREAM_FLOW}"
    binding = f"$KV.{S.KV_SCENARIOS}.{run_id}"
    read_back = f"$JS.API.DIRECT.GET.KV_{S.KV_SCENARIOS}.{binding}"
    async with Wire(client, tickets, binding, read_back) as wire:
        await client.submit_scenario(parse_scenario(calculator_steps("door", 1)), run_id=run_id)
        state = await client.wait(run_id, timeout=bound(30))
    assert state.status == "completed", state.final_reason
    assert [m for m in wire.seen if m.subject == tickets] == []
    assert len([m for m in wire.seen if m.subject == binding]) == 1
    readers = [m.reply for m in wire.seen if m.subject == read_back]
    assert not any(r.startswith(S.inbox_prefix("planner")) for r in readers), readers


# --- a run's first budget ask ----------------------------------------------------------------------------


def first_ask(run_id: str) -> BudgetRequest:
    return BudgetRequest(
        run_id=run_id,
        turn=1,
        model="m",
        sections=SectionTokens(goal=10),
        spent=Usage(),
        context_budget_tokens=100_000,
        run_token_budget=100_000,
        cost_ceiling_usd=10.0,
    )


async def test_a_runs_first_budget_ask_creates_its_ledger_without_reading_it(one_client: Client) -> None:
    """The governor's first ask of a run (nothing spent yet) writes its ledger with a create, reading nothing first."""
    client = one_client
    run_id = f"run-ledger-{uuid.uuid4().hex[:12]}"
    key = f"$KV.{S.KV_BUDGETS}.{S.kv_key(run_id)}"
    read = f"$JS.API.DIRECT.GET.KV_{S.KV_BUDGETS}.{key}"
    async with Wire(client, key, read) as wire:
        await client.submit_scenario(parse_scenario(calculator_steps("first-ask", 1)), run_id=run_id)
        state = await client.wait(run_id, timeout=bound(30))
    assert state.status == "completed", state.final_reason
    seen = [m.subject for m in wire.seen]
    # its first operation on the ledger is the create (the one read is the run's end: its total to the tenant's day)
    assert seen and seen[0] == key and wire.seen[0].headers.get(CREATE_HEADER) == "0", seen


async def test_a_first_budget_ask_whose_ledger_exists_gets_the_stored_answer(one_client: Client) -> None:
    """The ask of a run that has spent nothing, whose ledger another replica wrote (it answered this turn before:
    the planner's request timed out and is asked again here): the create the guess makes finds the ledger there,
    it is read, and the turn's stored decision is the answer; nothing more is written."""
    client = one_client
    other, run_id = (f"run-again-{uuid.uuid4().hex[:12]}" for _ in range(2))
    key = f"$KV.{S.KV_BUDGETS}.{S.kv_key(run_id)}"
    read = f"$JS.API.DIRECT.GET.KV_{S.KV_BUDGETS}.{key}"
    asked = await client.bus.nc.request(S.BUDGET_RESERVE, first_ask(other).model_dump_json().encode(), bound(5))
    stored, _ = await client.bus.kv_get(S.KV_BUDGETS, S.kv_key(other), BudgetLedger)
    assert stored is not None and list(stored.decisions) == ["1"]
    decided = stored.decisions["1"].model_copy(update={"reasons": ["decided by another replica"]})
    theirs = stored.model_copy(update={"run_id": run_id, "decisions": {"1": decided}})
    await client.bus.kv_put(S.KV_BUDGETS, S.kv_key(run_id), theirs, revision=0)
    async with Wire(client, key, read) as wire:
        again = await client.bus.nc.request(S.BUDGET_RESERVE, first_ask(run_id).model_dump_json().encode(), bound(5))
    assert BudgetDecision.model_validate_json(asked.data) == stored.decisions["1"]
    assert BudgetDecision.model_validate_json(again.data) == decided
    seen = [m.subject for m in wire.seen]
    assert seen[0] == key and wire.seen[0].headers.get(CREATE_HEADER) == "0", seen  # a create, refused
    assert read in seen and key not in seen[seen.index(read) :], seen  # then read: nothing more written
    ledger, _ = await client.bus.kv_get(S.KV_BUDGETS, S.kv_key(run_id), BudgetLedger)
    assert ledger == theirs


# --- the client's wait, at a run's end -------------------------------------------------------------------


async def test_a_wait_reads_the_final_state_and_the_final_event_together_once_that_event_is_relayed(
    one_client: Client,
) -> None:
    """Woken by the run's final event, ``wait`` reads the run's state and looks for that event in the stream
    together (both asked before either answer is in), not one after the other; it returns the final state and
    reads nothing more."""
    client = one_client
    run_id = f"run-wait-{uuid.uuid4().hex[:12]}"
    state_read = f"$JS.API.DIRECT.GET.KV_{S.KV_RUNS}.$KV.{S.KV_RUNS}.{run_id}"
    events_read = f"$JS.API.DIRECT.GET.{S.STREAM_EVT}"
    inboxes = f"{client.bus.nc._inbox_prefix.decode()}.>"
    await client.submit_scenario(parse_scenario(calculator_steps("wait-together", 1)), run_id=run_id)
    async with Wire(client, state_read, events_read, inboxes) as wire:
        state = await client.wait(run_id, timeout=bound(30), history=False)
    assert state.status == "completed", state.final_reason
    reads = [i for i, m in enumerate(wire.seen) if m.subject == state_read]
    finals = [i for i, m in enumerate(wire.seen) if m.subject == events_read and run_id.encode() in m.data]
    assert len(finals) == 1, [m.subject for m in wire.seen]  # the final event, read once
    last = reads[-1]  # the read of the final state
    answered = [i for i, m in enumerate(wire.seen) if m.subject == wire.seen[last].reply]
    assert answered and finals[0] < answered[0], "the final event was read only after the state's answer"
