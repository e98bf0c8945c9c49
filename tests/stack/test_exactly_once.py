"""Nothing runs twice: a non-idempotent tool runs at most once per call, whatever point its
executor dies at, and the tool that runs is the one the subject names.

A real executor process, hosting only the counted test tool ``transfer_funds`` (each run of
it writes one charge to ``lw_demo``), is started with ``LW_FAULT_INJECT=<point>``: it exits
(``os._exit``, like a SIGKILL) at that point of the call. A second, healthy executor then
takes the redelivered command over.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

import pytest

from loopwarden.client import Client
from loopwarden.stack import LocalStack
from services.executor.ledger import LedgerEntry
from shared import subjects as S
from shared.messages import ToolCall
from shared.scenario import parse_scenario
from tests.support.otlp_collector import OtlpCollector
from tests.support.paths import ROOT
from tests.support.payments import count_charges
from tests.support.runs import GOOD_SEARCH, escalations_of, submit, tool_results
from tests.support.timing import bound, polls

TOOLS_DIR = ROOT / "tests" / "tools"
FAULT_EXIT = 70
ONLY = {"LW_TOOL_CONTRACT_DIR": str(TOOLS_DIR), "LW_MCP_SERVERS": ""}  # the test tools, no MCP server to mount


async def charges(client: Client, run_id: str) -> int:
    return await count_charges(client.bus.js, run_id)


def money_scenario(name: str, tool: str = "transfer_funds") -> dict[str, object]:
    args = {"customer_id": "cus_crash1", "amount_cents": 700, "currency": "eur"}
    return {
        "name": name,
        "task": "Move 7 EUR, once.",
        "planner": [{"tool_calls": [{"name": tool, "id": "toolu_money", "input": args}]}, submit("moved")],
    }


async def executor_dies(stack: LocalStack, client: Client, tool: str, point: str, scenario: dict[str, Any]) -> str:
    """An executor hosting only ``tool``, started with ``LW_FAULT_INJECT=point``, exits there while it
    runs ``scenario``'s call: the run's id."""
    env = {**ONLY, "LW_EXECUTOR_TOOLS": tool, "LW_FAULT_INJECT": point}
    faulty = stack.start_service("executor", label=f"executor-{scenario['name']}", extra_env=env)
    stack.wait_ready([faulty])
    run_id = await client.submit_scenario(parse_scenario(scenario))
    code = await asyncio.to_thread(faulty.popen.wait, 60)
    assert code == FAULT_EXIT, f"the executor was to exit at {point}"
    return run_id


@contextlib.asynccontextmanager
async def healthy_executor(stack: LocalStack, tool: str, label: str) -> AsyncIterator[None]:
    """An executor hosting only ``tool`` while the block runs (e.g. taking a redelivery over)."""
    proc = stack.start_service("executor", label=f"executor-{label}", extra_env={**ONLY, "LW_EXECUTOR_TOOLS": tool})
    try:
        stack.wait_ready([proc])
        yield
    finally:
        proc.popen.terminate()
        await asyncio.to_thread(proc.popen.wait, 15)


# --- a crash at each point between the side effect and the final record ---------------------------


@pytest.mark.parametrize(
    ("point", "charged_before_crash", "outcome"),
    [
        ("after_start_recorded", 0, "unknown_outcome"),  # cannot be told apart from a crash mid-call
        ("after_side_effect", 1, "unknown_outcome"),  # charged, nothing recorded: a human decides
        ("after_final_recorded", 1, "completed"),  # the recorded result is published by the next delivery
        ("after_final_published", 1, "completed"),  # published, not acked: republished, deduplicated
    ],
)
async def test_an_executor_dying_at_any_point_never_charges_twice(
    stack: LocalStack, client: Client, point: str, charged_before_crash: int, outcome: str
) -> None:
    run_id = await executor_dies(stack, client, "transfer_funds", point, money_scenario(f"crash-{point}"))
    assert await charges(client, run_id) == charged_before_crash
    async with healthy_executor(stack, "transfer_funds", f"after-{point}"):
        if outcome == "unknown_outcome":
            state = await client.wait(run_id, timeout=bound(60), until=("awaiting_human",))
            assert state.awaiting is not None and state.awaiting.kind == "unknown_outcome"
            items = await escalations_of(client, run_id)
            assert [e.kind for e in items] == ["unknown_outcome"]
        else:
            state = await client.wait(run_id, timeout=bound(60))
            assert state.status == "completed", state.final_reason
            kinds = [e.kind for e in await client.events(run_id)]
            assert kinds.count("tool.succeeded.transfer_funds") == 1
        assert await charges(client, run_id) == charged_before_crash  # the second executor charged nothing


@pytest.mark.parametrize(
    ("point", "writes", "charged"),
    [
        ("after_side_effect", 0, 2),  # nothing recorded (an idempotent call is not claimed): safe to run again
        ("after_final_recorded", 1, 1),  # its final was recorded with a create: published, not run again
    ],
)
async def test_an_idempotent_call_runs_again_only_when_no_final_was_recorded(
    stack: LocalStack, client: Client, point: str, writes: int, charged: int
) -> None:
    scenario = money_scenario(f"idempotent-{point}", tool="sync_ledger")
    run_id = await executor_dies(stack, client, "sync_ledger", point, scenario)
    assert await charges(client, run_id) == 1
    key = S.kv_key(run_id, "i1", "toolu_money")
    entry, _ = await client.bus.kv_get(S.KV_TOOL_LEDGER, key, LedgerEntry)
    if writes == 0:
        assert entry is None  # the first delivery was not claimed
    else:  # one write: the final, with the create
        assert entry is not None and entry.final is not None
        assert len(await (await client.bus.kv(S.KV_TOOL_LEDGER)).history(key)) == writes
    async with healthy_executor(stack, "sync_ledger", f"after-idempotent-{point}"):
        state = await client.wait(run_id, timeout=bound(60))
        assert state.status == "completed", state.final_reason
        kinds = [e.kind for e in await client.events(run_id)]
        assert kinds.count("tool.succeeded.sync_ledger") == 1, kinds
        assert await charges(client, run_id) == charged


async def test_an_idempotent_call_run_again_after_a_crash_keeps_each_deliverys_failed_attempts(
    stack: LocalStack, client: Client
) -> None:
    """``retry_ledger`` is idempotent and retried: each delivery's first attempt fails (a scripted 503),
    its second runs the real tool. The first executor dies right after that side effect, with no
    ledger entry (an idempotent call's first delivery is not claimed); the second delivery creates
    the entry, counting the first as a run, so its failed attempt's event does not repeat the first
    one's id (the stream would drop it as a duplicate)."""
    scenario = money_scenario("idempotent-attempts", tool="retry_ledger")
    fail = {"fail": "transient", "error": "HTTP 503 Service Unavailable", "times": 1}
    scenario["tools"] = {"retry_ledger": [fail, {"latency_s": 0}, fail, {"latency_s": 0}]}
    run_id = await executor_dies(stack, client, "retry_ledger", "after_side_effect", scenario)
    entry, _ = await client.bus.kv_get(S.KV_TOOL_LEDGER, S.kv_key(run_id, "i1", "toolu_money"), LedgerEntry)
    assert entry is None  # the first delivery ran unclaimed
    async with healthy_executor(stack, "retry_ledger", "after-idempotent-attempts"):
        state = await client.wait(run_id, timeout=bound(60))
        assert state.status == "completed", state.final_reason
        events = await client.events(run_id)
        failed = [e.headers.get("Nats-Msg-Id") for e in events if e.kind == "tool.attempt.retry_ledger"]
        assert len(failed) == 2 and len(set(failed)) == 2, failed  # one per delivery, neither dropped
        assert [e.payload["attempts"] for e in events if e.kind == "tool.succeeded.retry_ledger"] == [2]
        assert await charges(client, run_id) == 2  # idempotent: safe to run again, and it was


# --- the subject names the tool ----------------------------------------------------------------------


async def test_a_command_on_the_search_subject_naming_charge_card_is_dead_lettered(client: Client) -> None:
    run_id = "run-subject-boundary-" + os.urandom(4).hex()
    forged = ToolCall(
        run_id=run_id,
        iteration=1,
        call_id="toolu_forged",
        attempt_id=S.kv_key(run_id, "i1", "toolu_forged"),
        tool="charge_card",
        requested_tool="charge_card",
        arguments={"customer_id": "cus_forged1", "amount_cents": 100, "currency": "usd"},
    )
    await client.bus.publish(S.tool_execute("search"), forged, msg_id=f"forged-{run_id}")
    letter = None
    for _ in range(polls(200)):
        letters = [d for d in await client.dead_letters() if run_id in d.body]
        if letters:
            letter = letters[0]
            break
        await asyncio.sleep(0.05)
    assert letter is not None, "the forged command was not dead-lettered"
    assert letter.service == "executor" and letter.subject == S.tool_execute("search")
    assert "charge_card" in letter.reason and "search" in letter.reason
    await asyncio.sleep(bound(0.5))
    assert await charges(client, run_id) == 0
    events = await client.events(run_id)
    assert not any("charge_card" in e.kind for e in events)  # nothing ran, nothing was reported as run


# --- a non-idempotent call cut off by its timeout is not retried ----------------------------------------


async def test_a_timed_out_non_idempotent_call_is_an_unknown_outcome_not_a_retry(
    stack: LocalStack, client: Client
) -> None:
    """slow_charge allows 3 attempts, but its charge happens before the (scripted) slow answer runs
    into the 1 s timeout: retrying would charge again, so the outcome goes to a human."""
    async with healthy_executor(stack, "slow_charge", "slow-charge"):
        scenario = money_scenario("slow-charge", tool="slow_charge")
        scenario["tools"] = {"slow_charge": [{"latency_s": 3, "times": "always"}]}
        run_id = await client.submit_scenario(parse_scenario(scenario))
        state = await client.wait(run_id, timeout=bound(60), until=("awaiting_human",))
        assert state.awaiting is not None and state.awaiting.kind == "unknown_outcome"
        items = await escalations_of(client, run_id)
        assert [e.kind for e in items] == ["unknown_outcome"]
        assert await charges(client, run_id) == 1
        attempts = [e for e in await client.events(run_id) if e.kind == "tool.attempt.slow_charge"]
        assert len(attempts) == 1 and attempts[0].payload["failure_type"] == "timeout"


# --- every transient failure is an event ------------------------------------------------------------


async def test_every_transient_failure_is_published_with_its_attempt_and_whether_it_is_retried(
    client: Client,
) -> None:
    scenario = {
        "name": "transient-events",
        "task": "Search, then submit.",
        "planner": [
            {"tool_calls": [{"name": "search", "id": "toolu_s", "input": {"query": "dedupe"}}]},
            submit("found"),
        ],
        "tools": {"search": [{"fail": "transient", "error": "HTTP 503", "times": 2}, {"output": GOOD_SEARCH}]},
    }
    run_id = await client.submit_scenario(parse_scenario(scenario))
    state = await client.wait(run_id, timeout=bound(60))
    assert state.status == "completed", state.final_reason  # the planner waited for the real outcome
    events = await client.events(run_id)
    failures = [e.payload for e in events if e.kind == "failure.transient.search"]
    assert [(f["attempts"], f.get("will_retry", False)) for f in failures] == [(1, True), (2, True)]
    assert [e.kind for e in events].count("tool.succeeded.search") == 1
    [result] = [r for r in tool_results(state) if r.tool_use_id == "toolu_s"]
    assert not result.is_error


async def test_the_last_transient_failure_is_the_outcome_and_says_it_is_not_retried(client: Client) -> None:
    scenario = {
        "name": "transient-final",
        "task": "Search, then submit.",
        "planner": [
            {"tool_calls": [{"name": "search", "id": "toolu_s", "input": {"query": "dedupe"}}]},
            submit("search is down"),
        ],
        "tools": {"search": [{"fail": "transient", "error": "HTTP 503", "times": "always"}]},
    }
    run_id = await client.submit_scenario(parse_scenario(scenario))
    state = await client.wait(run_id, timeout=bound(60))
    events = await client.events(run_id)
    failures = [e.payload for e in events if e.kind == "failure.transient.search"]
    # stored without its defaults: a last failure says nothing of a retry (``will_retry`` false, left out)
    assert failures and all(f["will_retry"] for f in failures[:-1]) and not failures[-1].get("will_retry", False)
    assert [f["attempts"] for f in failures] == list(range(1, len(failures) + 1))
    [result] = [r for r in tool_results(state) if r.tool_use_id == "toolu_s"]
    assert result.is_error  # the model saw the final failure, once


@pytest.mark.parametrize(
    ("tool", "arguments", "writes"),
    [
        # created before the tool ran, final recorded before it was published
        ("charge_card", {"customer_id": "cus_two1", "amount_cents": 100, "currency": "eur"}, 2),
        ("calculator", {"expression": "2+3"}, 1),  # idempotent: no claim, the final is the create
    ],
)
async def test_a_call_costs_its_ledger_writes_and_no_more(
    client: Client, tool: str, arguments: dict[str, object], writes: int
) -> None:
    scenario = {
        "name": f"ledger-writes-{tool}",
        "task": "Do it, then submit.",
        "planner": [{"tool_calls": [{"name": tool, "id": "toolu_c", "input": arguments}]}, submit("done")],
    }
    run_id = await client.submit_scenario(parse_scenario(scenario))
    state = await client.wait(run_id, timeout=bound(60))
    assert state.status == "completed"
    kv = await client.bus.kv(S.KV_TOOL_LEDGER)
    history = await kv.history(S.kv_key(run_id, "i1", "toolu_c"))
    assert len(history) == writes


async def test_retried_transient_failures_are_counted_in_the_failures_metric(
    client: Client, otlp: OtlpCollector
) -> None:
    scenario = {
        "name": "transient-metric",
        "task": "Compute, then submit.",
        "planner": [
            {"tool_calls": [{"name": "calculator", "id": "toolu_m", "input": {"expression": "1+1"}}]},
            submit("2"),
        ],
        # two 503s, then the real calculator: the call succeeds, its retried failures still count
        "tools": {"calculator": [{"fail": "transient", "error": "HTTP 503", "times": 2}, {"latency_s": 0}]},
    }
    run_id = await client.submit_scenario(parse_scenario(scenario))
    state = await client.wait(run_id, timeout=bound(60))
    assert state.status == "completed", state.final_reason

    def counted() -> float:
        points = otlp.metrics.get(("loopwarden-executor", "loopwarden.failures"), [])
        mine = [p["_value"] for p in points if p.get("tool") == "calculator" and p.get("failure.type") == "transient"]
        return max(mine, default=0)

    for _ in range(polls(120)):  # metrics are exported every 5 s
        if counted() >= 2:
            break
        await asyncio.sleep(0.25)
    assert counted() >= 2
