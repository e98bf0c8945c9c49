"""Sub-agents end to end (real SDK against the local Messages-API server): a `delegate` call starts
a child run on the bus whose final output is the call's result and whose cost rolls up into the
parent's; parent and child are one trace; fan-out is limited; above its threshold the spawn gate
waits for a human through the escalation queue."""

from __future__ import annotations

import asyncio
import uuid

from loopwarden.client import Client
from loopwarden.fake_model import FakeModel
from services.planner.delegation import child_run_id
from services.planner.state import RunState
from shared.messages import RunSubmit
from tests.support.model_turns import turn, use
from tests.support.otlp_collector import OtlpCollector
from tests.support.reads import planner_record, tenant_spent
from tests.support.runs import escalations_of
from tests.support.timing import bound, polls
from tests.support.tracing import spans_of_run

TOOLS = ["calculator", "delegate", "submit_result"]


def key() -> str:
    return f"d{uuid.uuid4().hex[:8]}"


async def start(client: Client, parent_key: str, tenant: str | None = None) -> str:
    run_id = f"run-sub-{parent_key}"
    task = f"Work it out, delegating. [script:{parent_key}]"
    await client.submit(RunSubmit(run_id=run_id, task=task, tools=TOOLS, tenant=tenant))
    return run_id


async def child_state(client: Client, run_id: str) -> RunState:
    await client.wait(run_id, timeout=bound(30))
    return await planner_record(client, run_id)


async def test_a_delegated_sub_task_returns_its_answer_and_its_cost(
    client: Client, messages_api: FakeModel, otlp: OtlpCollector
) -> None:
    pk, ck = key(), key()
    messages_api.script(
        pk,
        [
            turn(use("delegate", {"task": f"What is 6*7? [script:{ck}]", "tools": ["calculator"]}, "toolu_dg1")),
            turn(use("submit_result", {"answer": "42, as the sub-agent found"})),
        ],
    )
    messages_api.script(
        ck, [turn(use("calculator", {"expression": "6*7"})), turn(use("submit_result", {"answer": "42"}))]
    )
    tenant = f"t{uuid.uuid4().hex[:8]}"
    run_id = await start(client, pk, tenant)
    state = await client.wait(run_id, timeout=bound(40))
    assert state.status == "completed", state.final_reason
    assert state.final_output == "42, as the sub-agent found"

    child_id = child_run_id(run_id, "toolu_dg1")
    assert (await planner_record(client, run_id)).children == {"toolu_dg1": child_id}
    child = await child_state(client, child_id)
    assert child.status == "completed" and child.final_output == "42"
    assert child.config.parent_run_id == run_id and child.config.depth == 1
    assert child.config.allowed_tools == ["calculator", "submit_result"]
    # the child's final output is the delegate call's result
    result = messages_api.requests[pk][1]["messages"][-1]["content"][0]
    assert result["tool_use_id"] == "toolu_dg1" and result["content"] == "42" and result["is_error"] is False
    # its cost counts in the parent's: two parent turns and two child turns at 100/10
    assert child.usage.input_tokens == 200
    assert state.usage.input_tokens == 400 and state.usage.cost_usd == round(2 * child.usage.cost_usd, 8)
    # delegate was offered with its schema; the child (depth 1 < 2) may delegate only if its tools say so
    assert "delegate" in {t["name"] for t in messages_api.requests[pk][0]["tools"]}
    assert "delegate" not in {t["name"] for t in messages_api.requests[ck][0]["tools"]}
    kinds = [e.kind for e in await client.events(run_id)]
    assert "run.delegated" in kinds
    # the tenant's day counts the child once: under the child, and the parent's own spend under the parent
    assert child.config.tenant == tenant
    assert await tenant_spent(client, tenant, state.usage.cost_usd) == state.usage.cost_usd

    # parent and child are one trace
    spans = await spans_of_run(otlp, client, run_id, {"loopwarden-planner"})
    trace_id = spans[0].trace_id
    for _ in range(polls(100)):
        child_spans = [s for s in otlp.spans if s.attributes.get("loopwarden.run.id") == child_id]
        if any(s.name.startswith("chat ") for s in child_spans):
            break
        await asyncio.sleep(0.1)
    assert child_spans and {s.trace_id for s in child_spans} == {trace_id}


async def test_the_spawn_gate_waits_for_a_human_then_starts_the_child(client: Client, messages_api: FakeModel) -> None:
    pk, ck = key(), key()
    messages_api.script(
        pk,
        [
            turn(use("calculator", {"expression": "1+1"}), usage={"input_tokens": 30_000, "output_tokens": 0}),
            # ~$0.045 a model call so far: 6 child iterations are estimated at $0.27, above the $0.10 gate
            turn(use("delegate", {"task": f"Add 2 and 2. [script:{ck}]", "cost_ceiling_usd": 0.3}, "toolu_gate")),
            turn(use("submit_result", {"answer": "4"})),
        ],
    )
    messages_api.script(ck, [turn(use("submit_result", {"answer": "4"}))])
    run_id = await start(client, pk)
    waiting = await client.wait(run_id, timeout=bound(60), until=("awaiting_human",))
    assert waiting.awaiting is not None and waiting.awaiting.kind == "spawn"
    [item] = await escalations_of(client, run_id)
    assert item.kind == "spawn" and item.tool == "delegate"
    assert item.details["estimated_cost_usd"] > 0.10 and item.details["cost_ceiling_usd"] == 0.3
    child_id = child_run_id(run_id, "toolu_gate")
    assert (await client.bus.kv_get("lw_runs", child_id, RunState))[0] is None  # not started while gated
    assert (await client.resolve(item.escalation_id, "oncall", "approve", "worth it")).ok
    state = await client.wait(run_id, timeout=bound(40))
    assert state.status == "completed", state.final_reason
    child = await child_state(client, child_id)
    assert child.status == "completed" and child.config.cost_ceiling_usd == 0.3


async def test_a_denied_spawn_is_the_calls_result(client: Client, messages_api: FakeModel) -> None:
    pk = key()
    messages_api.script(
        pk,
        [
            turn(use("calculator", {"expression": "1+1"}), usage={"input_tokens": 30_000, "output_tokens": 0}),
            turn(use("delegate", {"task": "Something dear.", "cost_ceiling_usd": 0.3}, "toolu_no")),
            turn(use("submit_result", {"answer": "did it myself"})),
        ],
    )
    run_id = await start(client, pk)
    await client.wait(run_id, timeout=bound(60), until=("awaiting_human",))
    [item] = await escalations_of(client, run_id)
    assert (await client.resolve(item.escalation_id, "oncall", "reject", "too expensive")).ok
    state = await client.wait(run_id, timeout=bound(30))
    assert state.status == "completed", state.final_reason
    result = messages_api.requests[pk][2]["messages"][-1]["content"][0]
    assert result["is_error"] is True and "A human denied this sub-agent: too expensive" in result["content"]
    assert (await planner_record(client, run_id)).children == {}
    assert (await client.bus.kv_get("lw_runs", child_run_id(run_id, "toolu_no"), RunState))[0] is None


async def test_fan_out_is_limited(client: Client, messages_api: FakeModel) -> None:
    pk = key()
    kids = [key() for _ in range(5)]
    for i, k in enumerate(kids):
        messages_api.script(k, [turn(use("submit_result", {"answer": f"part {i}"}))])
    messages_api.script(
        pk,
        [
            turn(*(use("delegate", {"task": f"Part {i}. [script:{k}]"}, f"toolu_f{i}") for i, k in enumerate(kids))),
            turn(use("submit_result", {"answer": "four parts"})),
        ],
    )
    run_id = await start(client, pk)
    state = await client.wait(run_id, timeout=bound(60))
    assert state.status == "completed", state.final_reason
    assert len((await planner_record(client, run_id)).children) == 4  # LW_DELEGATE_MAX_CHILDREN
    results = {b["tool_use_id"]: b for b in messages_api.requests[pk][1]["messages"][-1]["content"]}
    assert [results[f"toolu_f{i}"]["content"] for i in range(4)] == [f"part {i}" for i in range(4)]
    assert results["toolu_f4"]["is_error"] and "fan-out limit" in results["toolu_f4"]["content"]
    assert messages_api.requests[kids[4]] == []
    # four children at 100/10 each, plus two parent turns
    assert state.usage.input_tokens == 600
