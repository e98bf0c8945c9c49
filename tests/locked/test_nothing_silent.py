"""Nothing silent (issue 24, item 4): a run whose tools the stack does not host never passes by accident.

A private nats-server runs the generated deploy/nats/auth.conf and every service runs as its own user.
A scripted run that calls a tool no replica hosts gets a typed ``unknown_tool`` failure naming the tools
it may call, published and counted, and past the correction cap an escalation; ``expect`` is not met
unless it states those calls; ``expect`` can state tool outcomes and escalation actions; the CLI names
the missing tools (``check-scenario --against-stack``) and ``submit`` refuses such a scenario.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from loopwarden.client import Client, tool_outcomes
from loopwarden.fake_model import FakeModel
from services.planner.hosting import HOSTED_TTL_S
from shared import subjects as S
from shared.messages import RunSubmit, ToolContract, ToolOutcome
from shared.permissions import operator_roster
from shared.scenario import Scenario, load_scenario, parse_scenario
from shared.settings import Settings
from tests.support import locked as L
from tests.support.paths import ROOT
from tests.support.runs import submit, tool_results
from tests.support.stacks import TEST_ENV
from tests.support.timing import bound, polls

SERVICES = ("planner", "executor", "validator", "governor", "escalation")
# exchange_rate is hosted only by an executor a test starts and stops (so its contract outlives its replica)
MAIN_EXECUTOR_TOOLS = "calculator,charge_card,enrich_company,readonly_cache,search,sql_query,submit_result"


@pytest.fixture(scope="module")
def fake_model() -> Iterator[FakeModel]:
    server = FakeModel().start()  # the live runs' model: the Messages-API stand-in
    try:
        yield server
    finally:
        server.stop()


# the module's ``locked``: the services but the judge, the operator roster, the main executor's tools; live runs'
# model the module's own Messages API (``fake_model``)
SILENT_ENV = {s: {"LW_OPERATORS": operator_roster()} for s in SERVICES}
SILENT_ENV["executor"]["LW_EXECUTOR_TOOLS"] = MAIN_EXECUTOR_TOOLS
LOCKED = L.OwnLocked("silent", SERVICES, TEST_ENV, SILENT_ENV, model="fake_model")


def as_user(url: str, user: str) -> Settings:
    return L.as_user(url, user, manage_streams=False, rpc_timeout_s=2)


def scenario(planner: list[dict[str, Any]], **fields: Any) -> Scenario:
    return parse_scenario(
        {"name": f"silent-{uuid.uuid4().hex[:6]}", "task": "How low is the stock?", "planner": planner, **fields}
    )


LOW_STOCK = {"tool_calls": [{"name": "low_stock", "input": {"below": 5}}]}


# --- a call to a tool no replica hosts ---------------------------------------------------------------------
async def test_a_tool_no_replica_hosts_is_a_typed_failure_and_past_the_cap_a_human(locked_client: Client) -> None:
    run = scenario([LOW_STOCK, LOW_STOCK, LOW_STOCK, submit("12 units")], expect={"status": "completed"})
    state = await locked_client.run_scenario(run, timeout=bound(60))
    # never a completed run: the third call is past the correction cap (2), and the run waits for a person
    assert state.status == "awaiting_human", state.final_reason
    assert state.awaiting is not None and state.awaiting.kind == "schema_cap"
    item = (await locked_client.show(state.awaiting.escalation_id)).escalations[0]
    assert item.tool == "low_stock" and item.details["failure_type"] == "unknown_tool"
    # the model saw a typed failure with the tools it may call, each time
    results = tool_results(state)
    assert len(results) >= 2 and all(r.is_error for r in results)
    assert "There is no tool named 'low_stock'. Available tools:" in results[0].content
    assert "calculator" in results[0].content and "submit_result" in results[0].content
    # counted: three failure.unknown_tool.low_stock outcomes (the planner's grant lets it publish them)
    events = await locked_client.events(state.run_id)
    failed = [
        ToolOutcome.model_validate(e.payload)
        for e in events
        if S.stem(e.subject) == S.failure("unknown_tool", "low_stock")
    ]
    assert [o.failure_type for o in failed] == ["unknown_tool"] * 3
    assert tool_outcomes(events) == {"low_stock": {"unknown_tool": 3}}
    assert [e.payload["detail"]["failure_type"] for e in events if e.kind == "run.tool_failed"] == ["unknown_tool"] * 3
    assert state.corrections["low_stock"] == {"failures": 3, "recovered": 0, "escalated": 1}
    mismatches = await locked_client.check(run, state)
    assert "status: expected completed, got awaiting_human" in mismatches


async def test_a_live_run_calling_a_tool_no_replica_hosts_gets_the_same_typed_failure(
    locked_client: Client, fake_model: FakeModel
) -> None:
    key = f"k{uuid.uuid4().hex[:8]}"
    call = {"type": "tool_use", "id": "toolu_low", "name": "low_stock", "input": {"below": 5}}
    fake_model.script(key, [{"content": [{**call, "id": f"toolu_low{n}"}]} for n in range(3)])
    run_id = f"run-live-{key}"
    await locked_client.submit(RunSubmit(run_id=run_id, task=f"Which products are low on stock? [script:{key}]"))
    state = await locked_client.wait(
        run_id, timeout=bound(60), until=("completed", "stopped", "failed", "awaiting_human")
    )
    assert state.status == "awaiting_human" and state.awaiting is not None, state.final_reason
    assert state.awaiting.kind == "schema_cap"
    # what the model was sent back: an error result naming the tools it may call
    sent = fake_model.requests[key][1]["messages"][-1]["content"][0]
    assert sent["type"] == "tool_result" and sent["is_error"] is True
    assert sent["content"].startswith("There is no tool named 'low_stock'. Available tools: calculator, ")
    assert tool_outcomes(await locked_client.events(run_id)) == {"low_stock": {"unknown_tool": 3}}


async def test_a_run_that_called_a_missing_tool_does_not_meet_an_expect_that_is_silent_about_it(
    locked_client: Client,
) -> None:
    run = scenario([LOW_STOCK, submit("12 units")], expect={"status": "completed"})
    state, mismatches = await locked_client.run_and_check(run, timeout=bound(60))
    assert state.status == "completed", state.final_reason  # the model went on without it (under the cap)
    assert mismatches == [
        "tool low_stock: called 1 time(s) but no replica of the stack hosts it (unknown_tool); start the stack "
        "with it, or state tools: {low_stock: {unknown_tool: 1}} in expect"
    ]
    data = run.model_dump(mode="json", by_alias=True, exclude_none=True)
    data["expect"]["tools"] = {"low_stock": {"unknown_tool": 1}}  # said: then it is what the scenario tests
    stated = parse_scenario(data)
    assert await locked_client.check(stated, state) == []


async def test_a_registered_tool_whose_replicas_are_gone_is_a_typed_failure_too(
    locked: L.Deployment, locked_client: Client, tmp_path: Path
) -> None:
    url, services = locked.url, locked.stack
    rate = {"tool_calls": [{"name": "exchange_rate", "input": {"base": "usd", "quote": "eur"}}]}
    rates_file = tmp_path / "rates.yaml"
    rates_file.write_text(yaml.safe_dump({"name": "rates", "task": "USD in EUR?", "planner": [rate, submit("x")]}))
    only = services.start_service(
        "executor", label="executor-rates", extra_env={**L.creds("executor"), "LW_EXECUTOR_TOOLS": "exchange_rate"}
    )
    try:
        await asyncio.to_thread(services.wait_ready, [only])
        hosted = await locked_client.run_scenario(scenario([rate, submit("0.92")]), timeout=bound(60))
        assert hosted.status == "completed", hosted.final_reason
        assert '"rate"' in tool_results(hosted)[0].content  # hosted: it ran
        checked = await asyncio.to_thread(lw, url, "check-scenario", "--against-stack", str(rates_file))
        assert checked.returncode == 0 and not checked.stderr, checked.stdout + checked.stderr
    finally:
        only.popen.terminate()
        await asyncio.to_thread(only.popen.wait, 15)
    async with Client(as_user(url, "admin"), identity="admin") as admin:
        assert "exchange_rate" in {c.name for c in (await admin.bus.kv_values(S.KV_CONTRACTS, ToolContract)).values()}
        for _ in range(polls(100)):  # the replica's last pull request expires (5 s)
            info = await admin.bus.js.consumer_info(S.STREAM_CMD, S.executor_durable("exchange_rate"))
            if not info.num_waiting and not info.num_ack_pending:
                break
            await asyncio.sleep(0.1)
    await asyncio.sleep(HOSTED_TTL_S + 0.2)  # the planner asks again (it saw the tool hosted a moment ago)
    checked = await asyncio.to_thread(lw, url, "check-scenario", "--against-stack", str(rates_file))
    assert checked.returncode == 1 and checked.stderr.startswith(f"{rates_file}: calls exchange_rate, which no "), (
        checked.stdout + checked.stderr
    )
    state = await locked_client.run_scenario(scenario([rate, submit("0.92")]), timeout=bound(30))
    # never a run waiting for ever on a command nobody takes: the call failed, typed, and the model saw it
    assert state.status == "completed", state.final_reason
    result = tool_results(state)[0]
    assert result.is_error and "There is no tool named 'exchange_rate'" in result.content
    assert tool_outcomes(await locked_client.events(state.run_id))["exchange_rate"] == {"unknown_tool": 1}


# --- expect: tool outcomes and escalation actions ---------------------------------------------------------
async def test_expect_states_tool_outcomes(locked_client: Client) -> None:
    shipped = load_scenario(ROOT / "scenarios" / "malformed-output-corrected.yaml")
    data = shipped.model_dump(mode="json", by_alias=True, exclude_none=True)
    data["expect"] = {"status": "completed", "tools": {"search": {"succeeded": 1, "output_invalid": 1}}}
    state, mismatches = await locked_client.run_and_check(parse_scenario(data), timeout=bound(60))
    assert mismatches == [], mismatches  # "search succeeded once after one output_invalid"
    data["expect"] = {"tools": {"search": {"succeeded": 2}, "calculator": {"succeeded": 0}}}
    assert await locked_client.check(parse_scenario(data), state) == [
        "tool search: expected succeeded 2, got 1 (output_invalid 1, succeeded 1)"
    ]


async def test_expect_states_escalation_actions(locked: L.Deployment, locked_client: Client) -> None:
    shipped = load_scenario(ROOT / "scenarios" / "correction-escalates.yaml")
    state = await locked_client.run_scenario(shipped, timeout=bound(60))
    assert state.status == "awaiting_human" and state.awaiting is not None
    async with Client(as_user(locked.url, "alice"), identity="alice") as alice:
        done = await alice.resolve(
            state.awaiting.escalation_id,
            "alice",
            "provide_result",
            "computed by hand",
            {"status": "ok", "expression": "1+1", "result": 2},
        )
        assert done.ok, done.error
    ended = await locked_client.wait(state.run_id, timeout=bound(60))
    assert ended.status == "completed", ended.final_reason
    data = shipped.model_dump(mode="json", by_alias=True, exclude_none=True)
    data["expect"] = {
        "status": "completed",
        "escalation_actions": ["provide_result"],
        "tools": {"calculator": {"input_invalid": 3, "succeeded": 0}},
    }
    assert await locked_client.check(parse_scenario(data), ended) == []
    data["expect"] = {"escalation_actions": ["abort"]}
    assert await locked_client.check(parse_scenario(data), ended) == [
        "escalation actions: expected ['abort'], got ['provide_result']"
    ]


# --- the CLI names the missing tools, and submit refuses ---------------------------------------------------
def lw(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    drop = ("NATS_URL", "LW_NATS_URL", "LW_STATE_DIR", "XDG_STATE_HOME")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env |= {"LW_NATS_URL": url, "LW_NATS_USER": "client", "LW_NATS_PASSWORD": L.PASSWORDS["client"]}
    env |= {"LW_MANAGE_STREAMS": "false"}
    return subprocess.run(
        [sys.executable, "-m", "loopwarden.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=bound(60),
        cwd=ROOT,
    )


def missing_tools_file(tmp_path: Path) -> Path:
    path = tmp_path / "restock.yaml"
    data = {
        "name": "restock",
        "task": "What is low on stock?",
        "planner": [LOW_STOCK, {"tool_calls": [{"name": "reorder", "input": {}}]}, submit("nothing")],
        "tools": {"low_stock": [{"output": {"items": []}}]},
        "expect": {"status": "completed"},
    }
    path.write_text(yaml.safe_dump(data))
    return path


async def test_check_scenario_against_the_stack_names_the_tools_it_does_not_host(
    locked: L.Deployment, tmp_path: Path
) -> None:
    path = missing_tools_file(tmp_path)
    done = await asyncio.to_thread(lw, locked.url, "check-scenario", "--against-stack", str(path))
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2, done.stderr
    assert lines[0].startswith(f"{path}: calls low_stock, which no executor of the running stack hosts")
    assert lines[1].startswith(f"{path}: calls reorder, which no executor of the running stack hosts")
    hosted = await asyncio.to_thread(
        lw, locked.url, "check-scenario", "--against-stack", str(ROOT / "scenarios" / "demo.yaml")
    )
    assert hosted.returncode == 0 and not hosted.stderr, hosted.stdout + hosted.stderr


async def test_submit_refuses_a_scenario_calling_tools_the_stack_does_not_host(
    locked: L.Deployment, locked_client: Client, tmp_path: Path
) -> None:
    path = missing_tools_file(tmp_path)
    before = len(await locked_client.events(subjects=f"{S.P}.evt.>"))
    done = await asyncio.to_thread(lw, locked.url, "submit", "--scenario", str(path), "--wait")
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1, done.stdout + done.stderr
    assert "calls low_stock, reorder, which no executor of the running stack hosts" in done.stderr
    await asyncio.sleep(bound(0.5))
    assert len(await locked_client.events(subjects=f"{S.P}.evt.>")) == before  # nothing was published: no run started
    anyway = await asyncio.to_thread(lw, locked.url, "submit", "--scenario", str(path), "--allow-missing-tools")
    assert anyway.returncode == 0 and anyway.stdout.startswith("run-"), anyway.stdout + anyway.stderr
