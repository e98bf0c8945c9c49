"""Nothing lost when a process dies, and old readers ignore new fields (independent upgrades)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from loopwarden.client import Client
from loopwarden.stack import LocalStack
from shared import subjects as S
from shared.messages import DeadLetter, RunSubmit
from shared.scenario import parse_scenario
from shared.settings import Settings
from tests.support.stacks import TEST_ENV
from tests.support.timing import bound, eventually, polls


async def test_killing_the_planner_mid_model_call_loses_nothing(tmp_path: Path) -> None:
    """One planner; it dies during a slow model turn; a new one takes the redelivered turn over."""
    stack = LocalStack(
        state_dir=tmp_path,
        env=TEST_ENV,
        services=("planner", "executor", "validator", "judge", "governor", "escalation"),
    )
    stack.start()
    try:
        async with Client(Settings(nats_url=stack.nats_url)) as client:
            run_id = await client.submit_scenario(
                parse_scenario(
                    {
                        "name": "planner-dies",
                        "task": "Compute, then submit.",
                        "planner": [
                            {"tool_calls": [{"name": "calculator", "input": {"expression": "6*7"}}]},
                            {
                                "latency_s": 2.0,
                                "text": "thinking hard",
                                "tool_calls": [{"name": "submit_result", "input": {"answer": "42"}}],
                            },
                        ],
                    }
                )
            )
            for _ in range(polls(200)):  # wait until the slow second turn is in flight
                state = await client.state(run_id)
                if state and state.iteration.n == 2:
                    break
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.5)
            planner = next(p for p in stack.procs if p.name == "planner")
            os.kill(planner.popen.pid, signal.SIGKILL)
            planner.popen.wait()
            replacement = stack.start_service("planner", label="planner-replacement")
            stack.wait_ready([replacement])
            state = await client.wait(run_id, timeout=bound(60))
            assert state.status == "completed" and state.final_output == "42"
            kinds = [e.kind for e in await client.events(run_id)]
            assert kinds.count("run.completed") == 1 and kinds.count("tool.succeeded.submit_result") == 1
            assert kinds.count("tool.succeeded.calculator") == 1  # the first turn's work was not redone
    finally:
        stack.stop()


async def test_a_message_with_fields_an_older_reader_does_not_know_is_processed(client: Client) -> None:
    from shared.scenario import parse_scenario as parse

    scenario = parse(
        {
            "name": "newer-writer",
            "task": "Submit 7.",
            "planner": [{"tool_calls": [{"name": "submit_result", "input": {"answer": "7"}}]}],
        }
    )
    run_id = "run-newer-writer-" + os.urandom(4).hex()
    from shared.canonical import digest_of

    data = scenario.model_dump(mode="json", by_alias=True)
    body = RunSubmit(run_id=run_id, task="Submit 7.", scenario=data, scenario_digest=digest_of(data)).model_dump(
        mode="json"
    )
    body["priority_class"] = "gold"  # a field from a newer client
    body["limits"]["max_parallel_tools"] = 4
    import json

    await client.bus.publish(S.run_submit(), json.dumps(body).encode(), msg_id=f"submit.{run_id}")
    state = await client.wait(run_id, timeout=bound(60))
    assert state.status == "completed" and state.final_output == "7"


async def test_a_governor_down_longer_than_the_delivery_budget_strands_no_run(tmp_path: Path) -> None:
    """Every service but the governor; a run is submitted and its first turn cannot get a budget decision
    for 8 s, more than twice the nak backoffs a crashing handler gets through its 5 deliveries
    (0.2 + 0.4 + 0.8 + 1.6 s). Waiting for a dependency spends no crash delivery: the planner holds the
    message and retries in place for an ack wait (3 s) per delivery, 15 s in all, so when the governor
    starts, the run completes, and nothing was dead-lettered.

    The outage is 8 s on any machine, not a bound scaled by LW_TEST_TIME_SCALE: scaled to 24 s it outlasts
    the 15 s waited, and the turn is dead-lettered as it should be (the next test)."""
    env = {**TEST_ENV, "LW_ACK_WAIT_S": "3", "LW_MAX_DELIVER": "5", "LW_REDELIVER_DELAY_S": "0.2"}
    outage_s = 8.0
    assert outage_s < 5 * 3, "the outage must stay inside the deliveries' ack waits"
    stack = LocalStack(
        state_dir=tmp_path, env=env, services=("planner", "executor", "validator", "judge", "escalation")
    )
    stack.start()
    try:
        async with Client(Settings(nats_url=stack.nats_url)) as client:
            scenario = {
                "name": "governor-late",
                "task": "Compute, then say done.",
                "planner": [{"tool_calls": [{"name": "calculator", "input": {"expression": "6*7"}}]}, {"text": "done"}],
                "answer_mode": "text",
            }
            run_id = await client.submit_scenario(parse_scenario(scenario))
            await asyncio.sleep(outage_s)
            assert (await client.state(run_id)).iteration.n == 1  # type: ignore[union-attr]
            stack.wait_ready([stack.start_service("governor")])
            state = await client.wait(run_id, timeout=bound(60))
            assert state.status == "completed", state.final_reason
            assert [d for d in await client.dead_letters() if run_id in d.body] == []
    finally:
        stack.stop()


async def test_a_dependency_that_never_comes_back_dead_letters_the_turn_with_its_reason(tmp_path: Path) -> None:
    """No governor at all, a 1 s ack wait and 2 deliveries: the run's first turn is held and retried
    through both deliveries, then dead-lettered with the reason it could not go on (the governor did
    not answer), not as a crashed handler."""
    env = {**TEST_ENV, "LW_ACK_WAIT_S": "1", "LW_MAX_DELIVER": "2"}
    stack = LocalStack(state_dir=tmp_path, env=env, services=("planner", "executor", "validator"))
    stack.start()
    try:
        async with Client(Settings(nats_url=stack.nats_url)) as client:
            scenario = {"name": "governor-gone", "task": "Say done.", "planner": [{"text": "done"}]}
            run_id = await client.submit_scenario(parse_scenario(scenario))
            letters: list[DeadLetter] = []
            for _ in range(polls(60)):
                letters = [d for d in await client.dead_letters() if run_id in d.body]
                if letters:
                    break
                await asyncio.sleep(0.5)
            assert len(letters) == 1, letters
            (letter,) = letters
            assert letter.service == "planner" and letter.deliveries == 2, letter
            assert "still not ready after 2 deliveries" in letter.reason and "governor" in letter.reason, letter.reason
            stalled = await eventually(
                lambda: client.state(run_id), what="the run's record", within=bound(10), every=0.2
            )
            for _ in range(polls(50)):  # not left `running`: stalled on its letter (tests/locked/test_stalled.py)
                if stalled is not None and stalled.status == "stalled":
                    break
                await asyncio.sleep(0.2)
                stalled = await client.state(run_id)
            assert stalled is not None and stalled.status == "stalled", stalled
    finally:
        stack.stop()
