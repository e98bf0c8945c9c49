"""Sub-agents and their parent's ceiling end to end (real SDK against the local Messages-API server):
two sub-agents started in one turn must not each be granted the parent's whole remaining budget
(issue 28, edge 3: a parent with a $0.10 ceiling ended at $0.1233)."""

from __future__ import annotations

import uuid

from loopwarden.client import Client
from loopwarden.fake_model import FakeModel
from services.planner.delegation import child_run_id
from shared.messages import RunLimits, RunSubmit
from tests.support.model_turns import turn, use
from tests.support.reads import planner_record
from tests.support.timing import bound

# ~$0.0285 a call at claude-sonnet-4-6's rates: a child's two calls are ~$0.057, more than half of $0.10
DEAR = {"input_tokens": 7000, "output_tokens": 500}


async def test_two_sub_agents_started_in_one_turn_keep_their_parent_within_its_ceiling(
    client: Client, messages_api: FakeModel
) -> None:
    pk, k1, k2 = (f"b{uuid.uuid4().hex[:8]}" for _ in range(3))
    messages_api.script(
        pk,
        [
            turn(
                use("delegate", {"task": f"Compute 6*7. [script:{k1}]", "tools": ["calculator"]}, "toolu_half1"),
                use("delegate", {"task": f"Compute 7*8. [script:{k2}]", "tools": ["calculator"]}, "toolu_half2"),
            ),
            turn(use("submit_result", {"answer": "both halves done"})),
        ],
    )
    for k, expr in ((k1, "6*7"), (k2, "7*8")):
        messages_api.script(
            k,
            [
                turn(use("calculator", {"expression": expr}), usage=DEAR),
                turn(use("submit_result", {"answer": "computed"}), usage=DEAR),
            ],
        )
    run_id = f"run-subbudget-{pk}"
    await client.submit(
        RunSubmit(
            run_id=run_id,
            task=f"Split it in two. [script:{pk}]",
            tools=["calculator", "delegate", "submit_result"],
            limits=RunLimits(cost_ceiling_usd=0.10),
        )
    )
    state = await client.wait(run_id, timeout=bound(60))
    record = await planner_record(client, run_id)
    # the parent's spend, its children's included, stays within its ceiling (it was $0.12 and more)
    assert state.usage.cost_usd <= 0.10, (state.usage.cost_usd, state.final_reason, record.children)
    assert state.status == "completed", state.final_reason
    # the first child was granted what was left; the second was told the running one holds the rest
    first = child_run_id(run_id, "toolu_half1")
    assert record.children == {"toolu_half1": first}
    assert record.granted == {}  # released when the child answered
    child = await planner_record(client, first)
    assert child.status == "completed" and child.config.cost_ceiling_usd < 0.10
    results = {b["tool_use_id"]: b for b in messages_api.requests[pk][1]["messages"][-1]["content"]}
    assert results["toolu_half1"]["content"] == "computed"
    assert results["toolu_half2"]["is_error"] is True
    assert "still running hold the rest of this run's cost ceiling" in results["toolu_half2"]["content"]
    assert messages_api.requests[k2] == []
