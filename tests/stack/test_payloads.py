"""Large payloads travel by reference, a result too large for anyone is a failure the model sees,
and no run is left ``running`` without an event that says why.

The real test tool ``bulk_report`` (tests/tools) builds a report of N megabytes and records
every run in ``lw_demo``; it is not idempotent, so it must run exactly once per call whatever
the size. The server's message limit is NATS' default 1 MB.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest

from loopwarden.client import Client
from loopwarden.progress import render
from loopwarden.stack import LocalStack, Proc
from shared import subjects as S
from shared.bounded import bounded
from shared.bus import Bus, kv_keys
from shared.canonical import digest_of
from shared.messages import FINAL_STATUSES, RunSubmit
from shared.payloads import KV_REF_KEY, PayloadError, PayloadRef
from shared.payloads import stream_config as payload_stream
from shared.scenario import Scenario, parse_scenario
from shared.settings import Settings
from tests.support.paths import ROOT
from tests.support.runs import escalations_of, submit, tool_results
from tests.support.stacks import TEST_ENV, settings_for
from tests.support.timing import bound, polls

TOOLS_DIR = ROOT / "tests" / "tools"
HARD_LIMIT = 4_000_000


async def runs_of(client: Client, kind: str, run_id: str) -> int:
    """How often the demo tool ``kind`` ran for the run (its markers in lw_demo), from the server's index of the
    bucket's keys: nats-py's watching ``KeyValue.keys`` misses keys written while it lists, and this read
    swallowed its timeout on a loaded session stack as "ran 0 times"."""
    return sum(1 for k in await kv_keys(client.bus.nc, S.KV_DEMO) if k.startswith(f"{kind}.{run_id}."))


@pytest.fixture(scope="module")
async def bulk_executor(stack: LocalStack) -> AsyncIterator[Proc]:
    env = {
        "LW_TOOL_CONTRACT_DIR": str(TOOLS_DIR),
        "LW_EXECUTOR_TOOLS": "bulk_report,odd_value",
        "LW_MCP_SERVERS": "",  # no MCP server to mount: a faster start
        "LW_TOOL_OUTPUT_MAX_BYTES": str(HARD_LIMIT),
    }
    proc = stack.start_service("executor", label="executor-bulk", extra_env=env)
    stack.wait_ready([proc])
    yield proc
    proc.popen.terminate()
    await asyncio.to_thread(proc.popen.wait, 15)


async def raw_run_state(client: Client, run_id: str) -> bytes:
    kv = await client.bus.kv(S.KV_RUNS)
    entry = await kv.get(run_id)
    return entry.value or b""


async def test_a_3_mb_result_travels_by_reference_and_the_tool_runs_once(bulk_executor: Proc, client: Client) -> None:
    scenario = {
        "name": "bulk-3mb",
        "task": "Build the big report, then submit.",
        "planner": [
            {"tool_calls": [{"name": "bulk_report", "id": "toolu_bulk", "input": {"megabytes": 3}}]},
            submit("report built"),
        ],
    }
    run_id = await client.submit_scenario(parse_scenario(scenario))
    state = await client.wait(run_id, timeout=bound(90))
    assert state.status == "completed", state.final_reason
    events = await client.events(run_id)
    kinds = [e.kind for e in events]
    assert await runs_of(client, "bulk", run_id) == 1, kinds  # the events say why, if the tool never ran
    assert kinds.count("tool.succeeded.bulk_report") == 1
    assert not any(k.startswith("failure.") for k in kinds)
    # a reader gets the event as it was published, its body fetched from the payload store
    (done,) = [e for e in events if e.kind == "tool.succeeded.bulk_report"]
    assert done.payload["tool"] == "bulk_report" and done.payload["attempts"] == 1
    assert render(done) == "[it 1] ✓ bulk_report validated"
    # the planner's KV-stored run state holds a bounded form, not megabytes (nor a reference to them)
    raw = await raw_run_state(client, run_id)
    assert len(raw) < 200_000 and KV_REF_KEY.encode() not in raw[:64]
    [result] = [r for r in tool_results(state) if r.tool_use_id == "toolu_bulk"]
    assert not result.is_error and "x" * 100 in result.content


async def test_a_result_above_the_hard_limit_is_a_failure_the_model_sees_and_nothing_reruns(
    bulk_executor: Proc, client: Client
) -> None:
    scenario = {
        "name": "bulk-6mb",
        "task": "Build the huge report, then submit.",
        "planner": [
            {"tool_calls": [{"name": "bulk_report", "id": "toolu_huge", "input": {"megabytes": 6}}]},
            submit("the report was too large"),
        ],
    }
    run_id = await client.submit_scenario(parse_scenario(scenario))
    state = await client.wait(run_id, timeout=bound(90))
    assert state.status == "completed", state.final_reason
    [result] = [r for r in tool_results(state) if r.tool_use_id == "toolu_huge"]
    assert result.is_error and "the result is 6.0 MB, above the 4.0 MB limit" in result.content
    await asyncio.sleep(bound(1.0))  # nothing is redelivered and run again behind the run's back
    assert await runs_of(client, "bulk", run_id) == 1
    kinds = [e.kind for e in await client.events(run_id)]
    assert kinds.count("failure.output_invalid.bulk_report") == 1
    assert "tool.succeeded.bulk_report" not in kinds


async def test_a_result_that_cannot_be_sent_ends_the_call_with_an_event_not_a_hang(
    bulk_executor: Proc, client: Client
) -> None:
    scenario = {
        "name": "odd-value",
        "task": "Call the odd tool.",
        "planner": [{"tool_calls": [{"name": "odd_value", "id": "toolu_odd", "input": {}}]}, submit("x")],
    }
    run_id = await client.submit_scenario(parse_scenario(scenario))
    state = await client.wait(run_id, timeout=bound(60), until=("awaiting_human", "completed", "stopped", "failed"))
    assert state.status == "awaiting_human" and state.awaiting is not None and state.awaiting.kind == "fatal"
    items = await escalations_of(client, run_id)
    assert [e.kind for e in items] == ["fatal"] and "cannot be sent as JSON" in items[0].reason
    assert await runs_of(client, "odd", run_id) == 1  # run once, not on every redelivery


# --- scenarios above the message limit, bound to their run -------------------------------------------


async def test_a_scenario_above_1_mb_is_submitted_and_replayed(client: Client) -> None:
    scenario = parse_scenario(
        {
            "name": "big-scenario",
            "description": "padding " * 200_000,  # 1.6 MB
            "task": "Compute 6*7, then submit.",
            "planner": [
                {"tool_calls": [{"name": "calculator", "input": {"expression": "6*7"}}]},
                submit("42"),
            ],
        }
    )
    assert len(scenario.model_dump_json()) > 1_500_000
    run_id = await client.submit_scenario(scenario)
    state = await client.wait(run_id, timeout=bound(60))
    assert state.status == "completed" and state.final_output == "42"


async def test_a_bound_scenario_is_immutable_and_must_match_its_digest(client: Client) -> None:
    base = {"name": "bound", "task": "Submit 1.", "planner": [submit("1")]}
    run_id = await client.submit_scenario(parse_scenario(base))
    state = await client.wait(run_id, timeout=bound(60))
    assert state.final_output == "1"

    other = parse_scenario({**base, "planner": [submit("2")]}).model_dump(mode="json", by_alias=True)
    again = RunSubmit(run_id=run_id, task="Submit 1.", scenario=other, scenario_digest=digest_of(other))
    await client.bus.publish(S.run_submit(), again, msg_id=f"resubmit.{run_id}")
    fresh = "run-bad-digest-" + os.urandom(4).hex()
    forged = RunSubmit(run_id=fresh, task="Submit 1.", scenario=other, scenario_digest="0" * 64)
    await client.bus.publish(S.run_submit(), forged, msg_id=f"submit.{fresh}")

    reasons: dict[str, str] = {}
    for _ in range(polls(100)):
        for letter in await client.dead_letters():
            for rid in (run_id, fresh):
                if letter.service == "planner" and f'"run_id":"{rid}"' in letter.body:
                    reasons[rid] = letter.reason
        if len(reasons) == 2:
            break
        await asyncio.sleep(0.1)
    assert "another scenario is already bound" in reasons.get(run_id, "")
    assert "does not match its scenario_digest" in reasons.get(fresh, "")
    # refused: never started, and its submitter hears it (``wait`` raises it unless ``until`` names it)
    refused = await client.wait(fresh, timeout=bound(30), until=FINAL_STATUSES)
    assert refused.status == "refused" and refused.model_calls == 0, refused
    state = await client.wait(run_id, timeout=bound(60))
    assert state.final_output == "1"  # the bound scenario is the one replayed


async def test_a_live_submit_of_a_taken_run_id_leaves_that_runs_scenario_bound(client: Client) -> None:
    """A submit without a scenario removes one stored under its run id before it starts (a live run is never
    scripted), but not when the id is another run's: that run's bound scenario stays, for its replay and its turns.
    The submit is removed from ``LW_SUBMIT`` once handled: then the scenario is read."""
    base = {"name": "kept", "task": "Submit 1.", "planner": [submit("1")]}
    run_id = await client.submit_scenario(parse_scenario(base))
    assert (await client.wait(run_id, timeout=bound(60))).final_output == "1"
    kv = await client.bus.kv(S.KV_SCENARIOS)
    assert (await kv.get(run_id)).value
    live = RunSubmit(run_id=run_id, task="Submit 1.")
    ack = await client.bus.publish(S.run_submit(), live, msg_id=f"live.{run_id}")
    js = client.bus.nc.jetstream()
    for _ in range(polls(100)):
        try:
            await js.get_msg(S.STREAM_SUBMIT, ack.seq)
        except nats.js.errors.NotFoundError:
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the live submit was not handled")
    try:
        stored = (await kv.get(run_id)).value
    except (nats.js.errors.KeyDeletedError, nats.js.errors.KeyNotFoundError):
        stored = None
    assert stored, "the taken run's scenario was removed"


# --- test doubles never touch live runs -------------------------------------------------------------


async def test_a_live_run_never_applies_stored_scripted_tool_behaviour(client: Client, messages_api) -> None:  # type: ignore[no-untyped-def]
    key = f"k{os.urandom(4).hex()}"
    run_id = f"run-live-{key}"
    # A scenario stored for this run id (as an admin could) that would make the calculator fail.
    trap = parse_scenario(
        {
            "name": "trap",
            "task": "x",
            "planner": [submit("scripted")],
            "tools": {"calculator": [{"fail": "fatal", "error": "SCRIPTED TRAP", "times": "always"}]},
        }
    )
    await client.bus.kv_put(S.KV_SCENARIOS, run_id, trap)
    usage = {"input_tokens": 100, "output_tokens": 10}
    calc = {"expression": "6*7"}
    messages_api.script(
        key,
        [
            {
                "content": [{"type": "tool_use", "id": "toolu_l1", "name": "calculator", "input": calc}],
                "usage": usage,
            },
            {
                "content": [{"type": "tool_use", "id": "toolu_l2", "name": "submit_result", "input": {"answer": "42"}}],
                "usage": usage,
            },
        ],
    )
    await client.submit(RunSubmit(run_id=run_id, task=f"What is 6*7? [script:{key}]"))
    state = await client.wait(run_id, timeout=bound(60))
    assert state.status == "completed" and state.final_output == "42"
    [result] = [r for r in tool_results(state) if r.tool_use_id == "toolu_l1"]
    assert not result.is_error and json.loads(result.content)["result"] == 42
    assert "SCRIPTED TRAP" not in json.dumps(state.model_dump(mode="json"))
    # submitted without a scenario: the one stored under its id was removed before the run started
    assert (await client.bus.kv_get(S.KV_SCENARIOS, run_id, Scenario))[0] is None

    # and a scenario submitted for it afterwards is refused, never bound to the live run
    data = trap.model_dump(mode="json", by_alias=True)
    late = RunSubmit(run_id=run_id, task="x", scenario=data, scenario_digest=digest_of(data))
    await client.bus.publish(S.run_submit(), late, msg_id=f"late-scenario.{run_id}")
    reason = ""
    for _ in range(polls(100)):
        reason = next(
            (d.reason for d in await client.dead_letters() if d.service == "planner" and run_id in d.body), ""
        )
        if reason:
            break
        await asyncio.sleep(0.1)
    assert f"run {run_id} was started without a scenario" in reason
    assert (await client.bus.kv_get(S.KV_SCENARIOS, run_id, Scenario))[0] is None


# --- the claim check itself ---------------------------------------------------------------------------


async def test_a_reference_yields_only_the_body_it_was_made_for(stack: LocalStack) -> None:
    bus = Bus(settings_for(stack), "test")
    await bus.connect()
    try:
        nc = bus.broker.connection
        body = os.urandom(1_500_000)
        headers: dict[str, str] = {}
        small = await bus.payloads.offload(nc, body, headers)
        assert len(small) < 500 and "Lw-Payload-Ref" in headers
        assert await bus.payloads.inflate(nc, small, headers) == body
        forged = PayloadRef.model_validate_json(small).model_copy(update={"sha256": "0" * 64})
        with pytest.raises(PayloadError):
            await bus.payloads.get(nc, forged)
        with pytest.raises(PayloadError):
            await bus.payloads.get(nc, PayloadRef(name="sha256-" + "1" * 64, size=3, sha256="1" * 64))
        assert await bus.payloads.inflate(nc, b"{}", {}) == b"{}"  # inline bodies pass through
    finally:
        await bus.broker.stop()


def test_a_bounded_value_keeps_its_head_and_says_how_big_it_was() -> None:
    small = {"a": 1}
    assert bounded(small, 100) == (small, None)
    text, size = bounded({"rows": ["x" * 1000] * 100}, 500)
    assert isinstance(text, str) and size is not None and size > 100_000
    assert len(text.encode()) < 700 and f"the full result is {size} bytes" in text


def test_settings_refuse_a_bad_fault_point() -> None:
    with pytest.raises(ValueError, match="fault_inject"):
        Settings(fault_inject="somewhere")  # type: ignore[arg-type]


# --- a final message the server refuses for good ----------------------------------------------------


async def test_a_result_the_server_refuses_for_good_ends_as_a_failure_event_not_a_running_run(
    tmp_path: Path,
) -> None:
    """The operator capped the payload stream at 2 MB; a 3 MB result can be stored nowhere. The call
    ends as a fatal failure event that says so (the tool ran once), and the run waits for a human."""
    stack = LocalStack(state_dir=tmp_path, env=TEST_ENV, services=()).start()  # the server only
    try:
        nc = await nats.connect(stack.nats_url)
        await nc.jetstream().add_stream(payload_stream(Settings(payload_max_bytes=2_000_000)))
        await nc.close()
        env = {
            "LW_TOOL_CONTRACT_DIR": str(TOOLS_DIR),
            "LW_EXECUTOR_TOOLS": "bulk_report",
            "LW_TOOL_OUTPUT_MAX_BYTES": str(HARD_LIMIT),
        }
        procs = [
            stack.start_service("planner"),
            stack.start_service("governor"),
            stack.start_service("executor", extra_env=env),
        ]
        stack.wait_ready(procs)
        async with Client(Settings(nats_url=stack.nats_url)) as client:
            scenario = {
                "name": "bucket-full",
                "task": "Build the big report, then submit.",
                "planner": [
                    {"tool_calls": [{"name": "bulk_report", "id": "toolu_full", "input": {"megabytes": 3}}]},
                    submit("done"),
                ],
            }
            run_id = await client.submit_scenario(parse_scenario(scenario))
            state = await client.wait(run_id, timeout=bound(90), until=("awaiting_human", "completed", "failed"))
            assert state.status == "awaiting_human" and state.awaiting is not None
            assert state.awaiting.kind == "fatal" and "could not be delivered" in state.awaiting.reason
            fatal = [e for e in await client.events(run_id) if e.kind == "failure.fatal.bulk_report"]
            assert len(fatal) == 1 and "maximum bytes exceeded" in fatal[0].payload["error"]
            assert await runs_of(client, "bulk", run_id) == 1
    finally:
        stack.stop()
