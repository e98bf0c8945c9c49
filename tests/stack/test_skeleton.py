"""Walking skeleton, end to end over a real NATS bus with every service as its own process."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import yaml

from loopwarden.client import Client
from loopwarden.stack import LocalStack
from shared import subjects as S
from shared.messages import RunSnapshot, RunSubmit
from tests.support.paths import ROOT
from tests.support.runs import run_scenario
from tests.support.timing import bound


def demo() -> dict:
    return yaml.safe_load((ROOT / "scenarios" / "demo.yaml").read_text())


async def test_demo_run_completes_with_its_final_answer(client: Client) -> None:
    scenario = demo()
    state = await run_scenario(client, scenario)
    assert state.status == "completed", state.final_reason
    assert "120 seconds" in (state.final_output or "")
    assert state.passed is True and state.first_draft_passed is True
    assert state.iteration.n == 3 and state.continue_count == 2 and state.retry_count == 0
    assert state.usage.input_tokens > 0 and state.usage.cost_usd > 0

    kinds = [e.kind for e in await client.events(state.run_id)]
    # every hop of the loop left an event: budget decisions happen per turn (no event unless a
    # threshold fires), the rest are visible in the run's own history
    for expected in (
        "run.started",
        "run.model_called",
        "tool.attempt.search",
        "tool.succeeded.search",
        "tool.succeeded.calculator",
        "tool.succeeded.submit_result",
        "run.judge_requested",
        "judge.verdict",
        "run.decided",
        "run.completed",
    ):
        assert expected in kinds, f"{expected} missing from {kinds}"
    # the transient 503 was retried by the executor, without the model seeing it: the failed attempt
    # is an event, the one that returned the output is counted in the outcome
    events = await client.events(state.run_id)
    attempts = [e.payload for e in events if e.kind == "tool.attempt.search"]
    assert [(a["attempt"], a["ok"]) for a in attempts] == [(1, False)]
    assert [e.payload["attempts"] for e in events if e.kind == "tool.succeeded.search"] == [2]


async def test_run_state_is_in_kv_and_updated_by_cas(client: Client) -> None:
    state = await run_scenario(client, demo())
    kv = await client.bus.kv(S.KV_RUNS)
    entry = await kv.get(state.run_id)
    assert RunSnapshot.model_validate_json(entry.value).status == "completed"
    # created once, then advanced revision by revision under CAS; only the current revision is
    # kept (nothing reads an older one: issue 15, bounded storage)
    history = await kv.history(state.run_id)  # (a last save may land after the snapshot read above)
    assert len(history) == 1 and history[0].revision >= entry.revision
    assert state.model_calls >= 3 and (entry.revision or 0) > 3


async def test_parallel_tool_calls_are_all_recorded_across_planner_replicas(client: Client) -> None:
    """Three outcomes of one turn land on two planner replicas concurrently; CAS keeps all three."""
    scenario = {
        "name": "parallel",
        "task": "Compute three things.",
        "planner": [
            {"tool_calls": [{"name": "calculator", "input": {"expression": f"{i} * 7"}} for i in range(1, 4)]},
            {"tool_calls": [{"name": "submit_result", "input": {"answer": "7, 14 and 21"}}]},
        ],
    }
    state = await run_scenario(client, scenario)
    assert state.status == "completed", state.final_reason
    user_turn = state.messages[2]
    results = [b for b in user_turn.content if b.type == "tool_result"]
    assert sorted(json.loads(r.content)["result"] for r in results) == [7, 14, 21]


async def test_a_malformed_message_is_dead_lettered_and_does_not_block(client: Client) -> None:
    await client.bus.publish(S.run_submit(), b'{"run_id": "bad id with spaces", "task": 42}', msg_id="malformed-1")
    ok = await run_scenario(client, demo())  # the consumer keeps going
    assert ok.status == "completed"
    for _ in range(int(bound(50))):
        letters = [d for d in await client.dead_letters() if d.subject == S.run_submit()]
        if letters:
            break
        await asyncio.sleep(0.1)
    letter = letters[-1]
    assert letter.service == "planner"
    assert "RunSubmit" in letter.reason and "run_id" in letter.reason and "task" in letter.reason
    assert json.loads(letter.body)["task"] == 42  # the original body is kept


async def test_a_scenario_that_runs_out_of_turns_fails_clearly(client: Client) -> None:
    state = await run_scenario(
        client,
        {
            "name": "short",
            "task": "Say something.",
            "planner": [{"tool_calls": [{"name": "calculator", "input": {"expression": "1+1"}}]}],
        },
    )
    assert state.status == "failed"
    assert "has 1 planner turn(s); model call #2 has no scripted reply" in (state.final_reason or "")


async def test_duplicate_submission_is_absorbed(client: Client) -> None:
    from shared.scenario import parse_scenario

    run_id = await client.submit_scenario(parse_scenario(demo()))
    await client.submit(RunSubmit(run_id=run_id, task="a different task, same id"))
    state = await client.wait(run_id, timeout=bound(60))
    assert state.task.startswith("How does JetStream")
    assert [e.kind for e in await client.events(run_id)].count("run.started") == 1


def test_a_bad_setting_stops_a_service_naming_it(stack: LocalStack) -> None:
    env = stack.service_env({"LW_MAX_ITERATIONS": "lots"})
    proc = subprocess.run(
        [sys.executable, "-m", "services.planner"], env=env, capture_output=True, text=True, timeout=bound(30)
    )
    assert proc.returncode == 2
    assert "LW_MAX_ITERATIONS" in proc.stderr and "valid integer" in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "services.judge"],
        env={**env, "LW_MAX_ITERATIONS": "3", "LW_NATS_URL": "http://x"},
        capture_output=True,
        text=True,
        timeout=bound(30),
    )
    assert proc.returncode == 2 and "LW_NATS_URL" in proc.stderr
