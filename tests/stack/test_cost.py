"""Cost as the bill says it, end to end: the graceful wrap-up (iteration cap and cost ceiling),
per-tenant daily ceilings, and the per-model calibration of the token estimate."""

from __future__ import annotations

import itertools
import uuid
from typing import Any

from loopwarden.client import Client
from loopwarden.fake_model import FakeModel
from services.governor.budget import BudgetLedger
from shared import subjects as S
from shared.messages import RunLimits, RunSubmit
from tests.support.reads import tenant_spent
from tests.support.runs import run_scenario
from tests.support.timing import bound

SMALL = {"input_tokens": 100, "output_tokens": 10}


def tool_use(name: str, args: dict[str, Any], usage: dict[str, int] | None = None) -> dict[str, Any]:
    return {
        "content": [{"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:8]}", "name": name, "input": args}],
        "usage": usage or SMALL,
    }


def say(text: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "usage": SMALL}


async def sdk_run(
    client: Client, api: FakeModel, replies: list[dict[str, Any]], **submit: Any
) -> tuple[Any, list[dict[str, Any]]]:
    key = f"w{uuid.uuid4().hex[:8]}"
    api.script(key, replies)
    run_id = f"run-cost-{key}"
    await client.submit(RunSubmit(run_id=run_id, task=f"Compute what you can. [script:{key}]", **submit))
    return await client.wait(run_id, timeout=bound(60)), api.requests[key]


# --- graceful wrap-up -------------------------------------------------------------------------


async def test_the_last_iteration_is_a_tool_less_wrap_up(client: Client, messages_api: FakeModel) -> None:
    state, reqs = await sdk_run(
        client,
        messages_api,
        [
            tool_use("calculator", {"expression": "6*7"}),
            tool_use("calculator", {"expression": "42+1"}),
            say("Best answer so far: 43 (6*7+1)."),
        ],
        limits=RunLimits(max_iterations=3),
    )
    assert state.status == "stopped"
    assert state.final_reason == "wrapped up: max iterations (3) reached; final answer written without tools"
    assert state.final_output == "Best answer so far: 43 (6*7+1)."
    assert len(reqs) == 3
    assert "tools" in reqs[0] and "tools" in reqs[1]
    last = reqs[2]
    assert "tools" not in last  # no tools on the wrap-up turn
    assert "Stop working now: max iterations (3) reached" in str(last["messages"][-1]["content"])
    assert last["messages"][-1]["role"] == "user"


async def test_iteration_cap_with_a_scripted_model_that_has_no_wrap_up_reply(client: Client) -> None:
    calc = [{"tool_calls": [{"name": "calculator", "input": {"expression": f"{i}+1"}}]} for i in range(2)]
    state = await run_scenario(
        client, {"name": "cap-wrap", "task": "count", "planner": calc, "limits": {"max_iterations": 3}}
    )
    # the wrap-up call found no scripted reply: the run stops as the cap says, naming both
    assert state.status == "stopped"
    assert "max iterations (3) reached" in (state.final_reason or "")
    assert "the wrap-up turn failed" in (state.final_reason or "")


async def test_near_the_cost_ceiling_one_wrap_up_turn_answers(client: Client, messages_api: FakeModel) -> None:
    # turn 1 spends $0.111 of $0.12: a normal turn fits neither on sonnet (~$0.031) nor on haiku
    # (~$0.011 with room for 2048 output tokens), but a wrap-up (1024 tokens on haiku, ~$0.006) does
    state, reqs = await sdk_run(
        client,
        messages_api,
        [
            tool_use("calculator", {"expression": "2*21"}, {"input_tokens": 37_000, "output_tokens": 0}),
            say("The answer is 42."),
        ],
        limits=RunLimits(cost_ceiling_usd=0.12),
        tools=["calculator"],
    )
    assert state.status == "stopped", state.final_reason
    assert (state.final_reason or "").startswith("wrapped up: cost ceiling $0.12 is near")
    assert state.final_output == "The answer is 42."
    assert len(reqs) == 2
    wrap = reqs[1]
    assert "tools" not in wrap and wrap["max_tokens"] == 1024
    assert wrap["model"] == "claude-haiku-4-5"  # the cheaper model answers the wrap-up
    assert state.usage.cost_usd <= 0.12
    kinds = [e.kind for e in await client.events(state.run_id)]
    assert "budget.wrap_up" in kinds


# --- per-tenant daily ceilings ------------------------------------------------------------------


async def test_a_tenant_over_its_daily_ceiling_is_blocked(client: Client, messages_api: FakeModel) -> None:
    capped = f"t{uuid.uuid4().hex[:8]}"  # every tenant's daily ceiling is $0.05 in the test stack
    # run A's last call costs $0.03: it is never asked about, so its tenant learns it from the run's end
    first, _ = await sdk_run(
        client,
        messages_api,
        [
            tool_use("calculator", {"expression": "1+1"}),
            tool_use("submit_result", {"answer": "2"}, {"input_tokens": 10_000, "output_tokens": 0}),
        ],
        tenant=capped,
    )
    assert first.status == "completed", first.final_reason
    assert await tenant_spent(client, capped, first.usage.cost_usd) == first.usage.cost_usd
    # run B of the same tenant: its first call (~$0.03 on sonnet) would cross $0.05 today
    second, reqs = await sdk_run(client, messages_api, [tool_use("submit_result", {"answer": "x"})], tenant=capped)
    assert second.status == "stopped"
    assert f"tenant {capped} daily cost ceiling $0.05 reached" in (second.final_reason or "")
    assert reqs == []  # blocked before any model call
    # another tenant is not affected
    other, _ = await sdk_run(
        client, messages_api, [tool_use("submit_result", {"answer": "y"})], tenant=f"o{uuid.uuid4().hex[:8]}"
    )
    assert other.status == "completed", other.final_reason


# --- calibration ---------------------------------------------------------------------------------


async def test_the_governor_calibrates_its_estimate_to_reported_tokens(client: Client, messages_api: FakeModel) -> None:
    # the provider reports 1.6x the tokens the planner estimates (its tokenizer is not ours)
    calls = [tool_use("calculator", {"expression": f"{i}*3"}) for i in range(4)]
    for reply in calls:
        reply["input_scale"] = 1.6
        del reply["usage"]
    state, _ = await sdk_run(client, messages_api, [*calls, tool_use("submit_result", {"answer": "done"})])
    assert state.status == "completed", state.final_reason
    ledger, _ = await client.bus.kv_get(S.KV_BUDGETS, S.kv_key(state.run_id), BudgetLedger)
    assert ledger is not None
    ratios = [ledger.decisions[t].calibration for t in sorted(ledger.decisions, key=int)]
    assert len(ratios) == 5
    # each reported turn moves the ratio toward what the provider says, and budgeting uses it
    assert all(b > a for a, b in itertools.pairwise(ratios)), ratios
    assert ratios[-1] > ratios[0] + 0.1
