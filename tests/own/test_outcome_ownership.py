"""Whose call it is: no replica declares a call's outcome unknown while the replica running it is alive,
and a known result is never lost to an "unknown" (issue 28, edges 1 and 2).

One stack for the module: a real nats-server and two executor replicas, both hosting ``slow_payout`` (a
non-idempotent charge whose answer comes 12 s after the charge). The nats-server is SIGKILLed while calls
run and started again on the same store and port after an outage longer than the ack wait, so their
commands are redelivered — to the other replica, or to the same one — while the replica that runs each
call is alive. ``LW_TOOL_LEASE_S`` is shorter than the outage: a lease lapses while its owner cannot renew it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from loopwarden.client import Client
from loopwarden.stack import LocalStack, wait_for_port
from services.executor.handlers import Executor
from services.executor.ledger import FinalPublish, LedgerEntry
from services.executor.recovery import model_error
from services.planner.outcomes import apply_outcome
from services.planner.state import RunState
from shared import subjects as S
from shared.bus import CasConflict
from shared.messages import (
    Escalation,
    EscalationWithdraw,
    FailureType,
    ToolCall,
    ToolOutcome,
    escalation_id_for_call,
    utcnow,
)
from shared.scenario import parse_scenario
from tests.support.paths import ROOT
from tests.support.payments import count_charges
from tests.support.runs import submit
from tests.support.stacks import TEST_ENV, running, settings_for
from tests.support.timing import bound
from tests.support.transitions import new_run, turn

TOOL = "slow_payout"
ANSWER_AFTER_S = 12.0  # the charge happens at once; the tool answers this long after it
OUTAGE_S = 7.0  # longer than the ack wait (3 s) and the lease (4 s)
LEASE_S = 4.0
SYSTEM = "loopwarden"  # who closes a queue item nobody needs to decide any more
KNOWN = "the call's result became known: the replica that ran it recorded it"
ENV = {**TEST_ENV, "LW_TOOL_LEASE_S": str(LEASE_S), "LW_MCP_SERVERS": ""}


def slow_payout(tools_dir: Path) -> Path:
    """A non-idempotent charge whose call may run a long time (the demo ``charge_card`` underneath)."""
    contract = json.loads((ROOT / "tests" / "tools" / "slow_charge.json").read_text())
    contract.update(
        name=TOOL,
        description="Pay a customer out through a slow bank: the payout happens, the answer comes late. "
        "NOT idempotent.",
        timeout_s=60,
        retry={"max_attempts": 1, "base_delay_s": 0.05, "max_delay_s": 0.1},
    )
    tools_dir.mkdir(parents=True, exist_ok=True)
    (tools_dir / f"{TOOL}.json").write_text(json.dumps(contract))
    return tools_dir


@pytest.fixture(scope="module")
def two_executors(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    state = tmp_path_factory.mktemp("ownership")
    tools = slow_payout(state / "tools")
    services = ("planner", "executor", "executor", "validator", "judge", "governor", "escalation")
    stack = LocalStack(
        state_dir=state,
        env={**ENV, "LW_TOOL_CONTRACT_DIR": str(tools)},
        services=services,
    )
    yield from running(stack)


@pytest.fixture
async def ownership_client(two_executors: LocalStack) -> AsyncIterator[Client]:
    async with Client(settings_for(two_executors)) as c:
        yield c


def payout(name: str, answer_after_s: float = ANSWER_AFTER_S) -> dict[str, Any]:
    args = {"customer_id": "cus_owner1", "amount_cents": 900, "currency": "eur"}
    return {
        "name": name,
        "task": "Pay out 9 EUR, once.",
        "planner": [{"tool_calls": [{"name": TOOL, "id": "toolu_pay", "input": args}]}, submit("paid")],
        "tools": {TOOL: [{"latency_s": answer_after_s, "times": "always"}]},
    }


async def until(what: str, check: Any, timeout: float = bound(30.0)) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        got = await check()
        if got:
            return got
        await asyncio.sleep(0.1)
    raise AssertionError(f"not within {timeout:.0f}s: {what}")


def restart_nats(stack: LocalStack, outage_s: float) -> None:
    """SIGKILL the nats-server, keep it down ``outage_s``, start it again on the same store and port."""
    nats = next(p for p in reversed(stack.procs) if p.name == "nats-server" and p.popen.poll() is None)
    os.kill(nats.popen.pid, signal.SIGKILL)
    nats.popen.wait(bound(10))
    assert stack.nats_url is not None
    port = int(stack.nats_url.rsplit(":", 1)[1])
    time.sleep(outage_s)
    stack.nats_port = port
    stack.start_nats()
    wait_for_port(port)


def ledger_key(run_id: str) -> str:
    return S.kv_key(run_id, "i1", "toolu_pay")


async def test_a_call_running_through_a_nats_restart_ends_with_its_known_result_not_a_human(
    two_executors: LocalStack, ownership_client: Client
) -> None:
    run_ids = [await ownership_client.submit_scenario(parse_scenario(payout(f"owner-{i}"))) for i in range(2)]

    async def charged_and_claimed() -> bool:
        for run_id in run_ids:
            entry, _ = await ownership_client.bus.kv_get(S.KV_TOOL_LEDGER, ledger_key(run_id), LedgerEntry)
            if entry is None or await count_charges(ownership_client.bus.js, run_id) != 1:
                return False
        return True

    await until("both payouts made, their calls claimed", charged_and_claimed)
    await asyncio.to_thread(restart_nats, two_executors, OUTAGE_S)
    async with Client(settings_for(two_executors)) as after:  # connected afresh, after the outage
        await outcomes_known(after, run_ids)


async def outcomes_known(client: Client, run_ids: list[str]) -> None:
    for run_id in run_ids:
        state = await client.wait(run_id, timeout=bound(90), until=("completed", "stopped", "failed", "awaiting_human"))
        kinds = [e.kind for e in await client.events(run_id)]
        assert state.status == "completed", (state.status, state.final_reason, kinds)
        assert not any("unknown_outcome" in k for k in kinds), kinds
        assert kinds.count(f"tool.succeeded.{TOOL}") == 1, kinds
        assert (await client.escalations(run_id=run_id, status="all")).escalations == []
        assert await count_charges(client.bus.js, run_id) == 1
        entry, _ = await client.bus.kv_get(S.KV_TOOL_LEDGER, ledger_key(run_id), LedgerEntry)
        assert entry is not None and entry.final is not None and "unknown_outcome" not in entry.final.subject


async def test_an_unknown_outcome_for_an_attempt_whose_result_the_stream_kept_is_stored_and_the_result_stands(
    two_executors: LocalStack, ownership_client: Client
) -> None:
    """The ledger lost a call's final (its entry is back to "claimed", its owner long gone) while the stream
    kept the validator's outcome; the command comes again. The executor's ``unknown_outcome`` is stored (it
    has its own message id: it used to be dropped as a duplicate of the validator's outcome), and the run keeps
    the known result (the planner takes a later "unknown" of a call with a result as stale)."""
    run_id = await ownership_client.submit_scenario(parse_scenario(payout("lost-final", answer_after_s=0)))
    state = await ownership_client.wait(run_id, timeout=bound(60))
    assert state.status == "completed", state.final_reason
    key = ledger_key(run_id)
    entry, revision = await ownership_client.bus.kv_get(S.KV_TOOL_LEDGER, key, LedgerEntry)
    assert entry is not None and entry.final is not None
    lost = entry.model_copy(update={"final": None, "owner": "gone", "lease_until": utcnow() - timedelta(seconds=60)})
    await ownership_client.bus.kv_put(S.KV_TOOL_LEDGER, key, lost, revision=revision)
    command = ToolCall(
        run_id=run_id,
        iteration=1,
        call_id="toolu_pay",
        attempt_id=key,
        tool=TOOL,
        requested_tool=TOOL,
        arguments={"customer_id": "cus_owner1", "amount_cents": 900, "currency": "eur"},
    )
    await ownership_client.bus.publish(S.tool_execute(TOOL), command, msg_id=f"{key}.again", run_id=run_id)

    async def unknown_stored() -> list[str]:
        return [e.kind for e in await ownership_client.events(run_id) if "unknown_outcome" in e.kind]

    assert await until("the unknown_outcome event stored", unknown_stored, timeout=LEASE_S * 3 + 15)
    kinds = [e.kind for e in await ownership_client.events(run_id)]
    assert kinds.count(f"tool.succeeded.{TOOL}") == 1, kinds
    after = await ownership_client.state(run_id)
    assert after is not None and after.status == "completed" and after.final_output == state.final_output
    assert await count_charges(ownership_client.bus.js, run_id) == 1  # nothing ran again


async def test_a_known_result_replaces_an_unknown_outcome_recorded_while_its_owner_ran_the_call(
    two_executors: LocalStack, ownership_client: Client
) -> None:
    """Another replica declared the call unknown while its owner was running it (the owner cut off from the
    bus for longer than a lease, say): the ledger holds the unknown_outcome final and the run waits for a
    human. The owner's result, when it comes, replaces that final and is published: the run goes on with it."""
    run_id = await ownership_client.submit_scenario(parse_scenario(payout("known-wins", answer_after_s=6)))
    key = ledger_key(run_id)

    async def claimed() -> tuple[LedgerEntry, int] | None:
        entry, revision = await ownership_client.bus.kv_get(S.KV_TOOL_LEDGER, key, LedgerEntry)
        return (
            (entry, revision)
            if entry is not None and await count_charges(ownership_client.bus.js, run_id) == 1
            else None
        )

    await until("the payout made, its call claimed", claimed)
    command = ToolCall(
        run_id=run_id,
        iteration=1,
        call_id="toolu_pay",
        attempt_id=key,
        tool=TOOL,
        requested_tool=TOOL,
        arguments={"customer_id": "cus_owner1", "amount_cents": 900, "currency": "eur"},
    )
    unknown = Executor.outcome(
        command, "unknown_outcome", model_error(TOOL, "unknown_outcome", "", 1), recoverable=False, attempts=1
    )
    final = FinalPublish(
        subject=S.failure("unknown_outcome", TOOL),
        msg_id=f"{key}.failed.unknown_outcome",
        payload=unknown.model_dump_json(by_alias=True),
        unknown_outcome=True,
    )
    while True:  # the owner renews its lease meanwhile: written on the revision read
        got = await claimed()
        assert got is not None
        entry, revision = got
        assert entry.final is None, "the call ended before the test declared it unknown"
        try:
            await ownership_client.bus.kv_put(
                S.KV_TOOL_LEDGER, key, entry.model_copy(update={"final": final}), revision=revision
            )
            break
        except CasConflict:
            continue
    await ownership_client.bus.publish(final.subject, final.payload.encode(), msg_id=final.msg_id, run_id=run_id)
    waiting = await ownership_client.wait(run_id, timeout=bound(30), until=("awaiting_human",))
    assert waiting.awaiting is not None and waiting.awaiting.kind == "unknown_outcome"

    state = await ownership_client.wait(run_id, timeout=bound(60))
    kinds = [e.kind for e in await ownership_client.events(run_id)]
    assert state.status == "completed", (state.status, state.final_reason, kinds)
    assert kinds.index(f"failure.unknown_outcome.{TOOL}") < kinds.index(f"tool.succeeded.{TOOL}"), kinds
    stored, _ = await ownership_client.bus.kv_get(S.KV_TOOL_LEDGER, key, LedgerEntry)
    assert stored is not None and stored.final is not None and stored.final.subject == S.RESULT_VALIDATE
    assert await count_charges(ownership_client.bus.js, run_id) == 1

    # the queue item raised for the unknown outcome is closed by the system, saying why: nobody is asked
    async def closed() -> Escalation | None:
        items = (await ownership_client.escalations(run_id=run_id, status="all")).escalations
        return items[0] if len(items) == 1 and items[0].status == "resolved" else None

    item = await until("the item raised for the unknown outcome closed", closed)
    assert (await ownership_client.escalations(run_id=run_id, status="open")).escalations == []
    assert item.escalation_id == waiting.awaiting.escalation_id and item.kind == "unknown_outcome"
    assert item.resolution is not None and item.resolution.resolved_by == SYSTEM
    assert item.resolution.note.startswith(KNOWN) and not item.resolution.by_sla
    last = item.trail[-1]
    assert (last.kind, last.operator, last.reason) == ("resolved", SYSTEM, item.resolution.note), last

    # the withdrawal delivered again changes nothing
    again = EscalationWithdraw(escalation_id=item.escalation_id, run_id=run_id, reason="again", unknown=unknown)
    await ownership_client.bus.publish(S.ESCALATION_WITHDRAW, again, msg_id=f"{item.escalation_id}.again")
    await drained(ownership_client, S.DURABLE_ESCALATION_WITHDRAW)
    # the item as the queue keeps it (turns=0: not the run's last turns a reader adds)
    assert (await ownership_client.show(item.escalation_id, turns=0)).escalations == [item]


def test_the_planner_withdraws_the_item_of_an_unknown_outcome_a_known_result_replaces() -> None:
    """The pure rule under the end-to-end test above: the transition that takes the known result publishes the
    withdrawal of the item the run waited on, carrying the unknown failure it was raised for; a duplicate known
    result (the wait is over) publishes nothing more."""
    state = searching()
    unknown = told(state, "unknown_outcome")
    assert state.awaiting is not None
    waited_on = state.awaiting.escalation_id
    known = apply_outcome(state, outcome_of(state, None))
    (withdrawal,) = [
        EscalationWithdraw.model_validate_json(i.payload) for i in known.items if i.model == "EscalationWithdraw"
    ]
    assert withdrawal.escalation_id == waited_on and withdrawal.run_id == state.run_id
    assert withdrawal.reason.startswith(KNOWN)
    assert withdrawal.unknown == unknown
    again = apply_outcome(state, outcome_of(state, None))
    assert again.items == []


async def drained(client: Client, durable: str) -> None:
    """Wait until the escalation service's ``durable`` on LW_CMD has handled everything published to it."""

    async def done() -> bool:
        info = await client.bus.js.consumer_info(S.STREAM_CMD, durable)
        return bool(info.num_pending == 0 and info.num_ack_pending == 0)

    await until(f"{durable} has handled its messages", done)


def outcome_of(state: RunState, ftype: FailureType | None) -> ToolOutcome:
    return ToolOutcome(
        run_id=state.run_id,
        iteration=state.iteration.n,
        call_id="c1",
        attempt_id="a-c1",
        tool="search",
        requested_tool="search",
        success=ftype is None,
        data={"ok": True} if ftype is None else None,
        failure_type=ftype,
        error=None if ftype is None else "it may or may not have run",
    )


def told(state: RunState, ftype: FailureType | None) -> ToolOutcome:
    outcome = outcome_of(state, ftype)
    apply_outcome(state, outcome)
    return outcome


def searching() -> RunState:
    state = new_run()
    turn(state, "", ("c1", "search", {"q": "news"}))
    return state


def unknown_outcome(run_id: str, call_id: str) -> ToolOutcome:
    """An ``unknown_outcome`` failure of a call the run never made (the planner takes it as stale)."""
    return ToolOutcome(
        run_id=run_id,
        iteration=1,
        call_id=call_id,
        attempt_id=S.kv_key(run_id, "i1", call_id),
        tool=TOOL,
        requested_tool=TOOL,
        arguments={"customer_id": "cus_owner1", "amount_cents": 900, "currency": "eur"},
        success=False,
        error="the outcome of the payout is unknown",
        failure_type="unknown_outcome",
        attempts=1,
    )


async def test_a_withdrawal_leaves_a_persons_resolution_standing_and_files_an_item_not_yet_queued_closed(
    two_executors: LocalStack, ownership_client: Client
) -> None:
    """A person resolved the item first: the withdrawal changes nothing. A withdrawal that comes before the
    failure event's item is queued files it closed, so the failure event arriving later asks nobody."""
    run_id = "withdraw-edges"
    person = unknown_outcome(run_id, "toolu_person")
    person_id = escalation_id_for_call(run_id, 1, "toolu_person")
    await ownership_client.bus.publish(
        S.failure("unknown_outcome", TOOL), person, msg_id=f"{person_id}.failed", run_id=run_id
    )

    async def queued() -> bool:
        return bool((await ownership_client.show(person_id)).escalations)

    await until("the person's item queued", queued)
    resolved = await ownership_client.resolve(person_id, "alice", "abort", note="I checked the bank: stop")
    assert resolved.ok, resolved.error
    withdrawal = EscalationWithdraw(escalation_id=person_id, run_id=run_id, reason=KNOWN, unknown=person)
    await ownership_client.bus.publish(S.ESCALATION_WITHDRAW, withdrawal, msg_id=f"{person_id}.withdrawn")
    await drained(ownership_client, S.DURABLE_ESCALATION_WITHDRAW)
    (item,) = (await ownership_client.show(person_id)).escalations
    assert item == resolved.escalations[0], item
    assert item.resolution is not None and item.resolution.resolved_by == "alice" and item.resolution.action == "abort"

    early = unknown_outcome(run_id, "toolu_early")
    early_id = escalation_id_for_call(run_id, 1, "toolu_early")
    withdrawal = EscalationWithdraw(escalation_id=early_id, run_id=run_id, reason=KNOWN, unknown=early)
    await ownership_client.bus.publish(S.ESCALATION_WITHDRAW, withdrawal, msg_id=f"{early_id}.withdrawn")
    await drained(ownership_client, S.DURABLE_ESCALATION_WITHDRAW)
    await ownership_client.bus.publish(
        S.failure("unknown_outcome", TOOL), early, msg_id=f"{early_id}.failed", run_id=run_id
    )

    async def failure_handled() -> bool:
        info = await ownership_client.bus.js.consumer_info(S.STREAM_EVT, S.DURABLE_ESCALATION_FAILURES)
        return bool(info.num_pending == 0 and info.num_ack_pending == 0)

    await until("the escalation service handled the failure event", failure_handled)
    (item,) = (await ownership_client.show(early_id)).escalations
    assert item.status == "resolved" and item.resolution is not None, item
    assert (item.resolution.resolved_by, item.resolution.note) == (SYSTEM, KNOWN)
    assert item.kind == "unknown_outcome" and item.tool == TOOL and item.call_id == "toolu_early"
    assert [i.escalation_id for i in (await ownership_client.escalations(run_id=run_id)).escalations] == []
