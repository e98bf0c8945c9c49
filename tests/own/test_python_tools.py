"""Tools as a Python author writes them (issue 24, items 3 and 7), on a real stack.

The tool module is the one docs/tools.md shows, written to a temporary folder (not on the path)
and named by ``LW_TOOL_MODULES``; two executor replicas host it (one of them only ``draft_order``,
so per-run state has to cross processes). The planner's live provider talks to a
``loopwarden fake-model`` started as a command, and the page's live-run snippet runs as written.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from loopwarden import Client, Criterion, Rubric, RunSnapshot, RunSubmit, new_run_id
from loopwarden.stack import LocalStack, Proc
from shared import subjects as S
from shared.scenario import parse_scenario
from tests.support.paths import ROOT
from tests.support.runs import escalations_of, submit, tool_results
from tests.support.stacks import TEST_ENV, running, settings_for
from tests.support.timing import bound

DOC = ROOT / "docs" / "tools.md"
HOSTED_BY_A = ("submit_result", "low_stock", "reorder_line", "add_to_order", "place_order")
HOSTED_BY_B = ("draft_order",)


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


@pytest.fixture(scope="module")
def tool_module(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """docs/tools.md's module, as a user would keep it: a file in a folder of their own."""
    path = tmp_path_factory.mktemp("user-tools") / "stock_tools.py"
    path.write_text(python_blocks()[0])
    return path


@pytest.fixture(scope="module")
def fake_model() -> Iterator[str]:
    """``loopwarden fake-model`` as a user starts it; its URL, from the line it prints."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "loopwarden.cli", "fake-model", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        found = re.search(r"http://127\.0\.0\.1:\d+", first)
        assert found, f"fake-model printed {first!r}"
        yield found.group(0)
    finally:
        proc.terminate()
        proc.wait(bound(15))


@pytest.fixture(scope="module")
def tools_stack(tmp_path_factory: pytest.TempPathFactory, tool_module: Path, fake_model: str) -> Iterator[LocalStack]:
    env = {**TEST_ENV, "ANTHROPIC_BASE_URL": fake_model, "LW_TOOL_MODULES": str(tool_module)}
    services = ("planner", "validator", "judge", "governor", "escalation")
    for stack in running(LocalStack(state_dir=tmp_path_factory.mktemp("python-tools"), env=env, services=services)):
        executors = [
            stack.start_service("executor", label=label, extra_env={"LW_EXECUTOR_TOOLS": ",".join(tools)})
            for label, tools in (("executor-a", HOSTED_BY_A), ("executor-b", HOSTED_BY_B))
        ]
        stack.wait_ready(executors, timeout=bound(120))
        yield stack


@pytest.fixture
async def tools_client(tools_stack: LocalStack) -> AsyncIterator[Client]:
    async with Client(settings_for(tools_stack)) as c:
        yield c


def call(name: str, **args: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "input": args}]}


async def scripted(
    client: Client, turns: list[dict[str, Any]], until: tuple[str, ...] = ("completed", "stopped", "failed")
) -> tuple[RunSnapshot, list[Any]]:
    scenario = parse_scenario({"name": "python-tools", "task": "Restock the warehouse.", "planner": turns})
    run_id = await client.submit_scenario(scenario)
    state = await client.wait(run_id, timeout=bound(60), until=until)
    return state, await client.events(run_id)


def payloads(events: list[Any], kind: str) -> list[dict[str, Any]]:
    return [e.payload for e in events if e.kind == kind]


# --- typed arguments and results ------------------------------------------------------------------


async def test_typed_arguments_are_checked_against_the_generated_input_contract(tools_client: Client) -> None:
    state, events = await scripted(
        tools_client,
        [call("low_stock", warehouse="east"), call("low_stock", warehouse="north", below=5), submit("BOLT-M6")],
    )
    assert state.status == "completed", state.error
    refused = payloads(events, "failure.input_invalid.low_stock")
    assert len(refused) == 1
    assert "warehouse" in refused[0]["error"] and "north" in refused[0]["error"]  # the enum, from the Literal
    ok = payloads(events, "tool.succeeded.low_stock")
    assert [o["data"] for o in ok] == [{"warehouse": "north", "items": [{"sku": "BOLT-M6", "units": 3}]}]


async def test_a_str_result_reaches_the_model_as_text(tools_client: Client) -> None:
    state, events = await scripted(tools_client, [call("reorder_line", sku="BOLT-M6", units=20), submit("ok")])
    assert state.status == "completed", state.error
    assert [o["data"] for o in payloads(events, "tool.succeeded.reorder_line")] == ["Reorder 20 x BOLT-M6"]
    assert not payloads(events, "failure.output_invalid.reorder_line")  # not parsed as JSON text
    shown = tool_results(await tools_client.state(state.run_id, history=True) or state)[0]
    assert not shown.is_error and "Reorder 20 x BOLT-M6" in str(shown.content)


# --- failures, as docs/tools.md says they are routed ------------------------------------------------


async def test_retry_is_retried_by_the_executor_and_fix_arguments_goes_to_the_model(tools_client: Client) -> None:
    state, events = await scripted(
        tools_client,
        [call("place_order", sku="BOLT-M7", units=5), call("place_order", sku="NUT-M6", units=10), submit("ordered")],
    )
    assert state.status == "completed", state.error
    # fix_arguments: not retried, the model reads the message (recoverable) and the run goes on
    wrong = payloads(events, "failure.tool_error.place_order")
    assert len(wrong) == 1 and wrong[0]["recoverable"] and wrong[0]["attempts"] == 1
    assert "unknown SKU 'BOLT-M7'" in wrong[0]["error"]
    shown = tool_results(await tools_client.state(state.run_id, history=True) or state)
    assert shown[0].is_error and "unknown SKU 'BOLT-M7'" in str(shown[0].content)
    # retry: the supplier was busy once; the executor tried again and the model saw only the order
    tries = payloads(events, "tool.attempt.place_order")
    assert [(t["call_id"] == wrong[0]["call_id"], t["failure_type"]) for t in tries] == [
        (True, "tool_error"),  # every failed attempt is published; this one was not retried
        (False, "transient"),
    ]
    placed = payloads(events, "tool.succeeded.place_order")
    assert len(placed) == 1 and placed[0]["attempts"] == 2
    assert placed[0]["data"]["sku"] == "NUT-M6" and placed[0]["data"]["order_id"].startswith("PO-")
    assert not shown[1].is_error


async def test_ask_human_puts_the_run_in_the_human_queue(tools_client: Client) -> None:
    state, events = await scripted(
        tools_client, [call("place_order", sku="BOLT-M6", units=500), submit("ordered")], until=("awaiting_human",)
    )
    assert state.status == "awaiting_human"
    fatal = payloads(events, "failure.fatal.place_order")
    assert len(fatal) == 1 and not fatal[0]["recoverable"] and fatal[0]["attempts"] == 1  # never retried
    items = await escalations_of(tools_client, state.run_id)
    assert len(items) == 1 and items[0].tool == "place_order"
    assert "a buyer must approve it" in items[0].reason


# --- per-run state ---------------------------------------------------------------------------------


async def test_per_run_state_is_kept_across_calls_and_executor_replicas(
    tools_client: Client, tools_stack: LocalStack
) -> None:
    state, events = await scripted(
        tools_client,
        [
            call("add_to_order", sku="BOLT-M6", units=20),
            call("add_to_order", sku="WASHER-M6", units=10),
            call("draft_order"),  # hosted by executor-b only: another process reads what executor-a wrote
            submit("drafted"),
        ],
    )
    assert state.status == "completed", state.error
    assert [o["data"] for o in payloads(events, "tool.succeeded.add_to_order")] == [1, 2]
    draft = [o["data"] for o in payloads(events, "tool.succeeded.draft_order")]
    assert draft == [[{"sku": "BOLT-M6", "units": 20}, {"sku": "WASHER-M6", "units": 10}]]
    # kept in the bucket (not in either process), and for this run only
    kv = await tools_client.bus.kv(S.KV_DEMO)
    assert (await kv.get(S.kv_key("state", state.run_id, "order"))).value
    _, other_events = await scripted(tools_client, [call("draft_order"), submit("empty")])
    assert [o["data"] for o in payloads(other_events, "tool.succeeded.draft_order")] == [[]]


# --- finding the module -----------------------------------------------------------------------------


def failed_start(stack: LocalStack, label: str, modules: str) -> tuple[int, str]:
    proc: Proc = stack.start_service("executor", label=label, extra_env={"LW_TOOL_MODULES": modules})
    code = proc.popen.wait(bound(60))
    return code, proc.log.read_text(errors="replace")


def test_a_module_that_cannot_be_imported_stops_the_executor_with_one_line(
    tools_stack: LocalStack, tmp_path: Path
) -> None:
    code, log = failed_start(tools_stack, "executor-missing", "stock_tool")
    assert code != 0
    lines = [line for line in log.splitlines() if line.strip()]
    assert lines and "Traceback" not in log, log
    assert lines[-1] == (
        "loopwarden-executor: tool module 'stock_tool' (from LW_TOOL_MODULES) cannot be imported: no module named "
        "'stock_tool'; install the package that holds it, or set LW_TOOL_MODULES to the file's path "
        "(e.g. /path/to/stock_tools.py)"
    )
    broken = tmp_path / "broken_tools.py"
    broken.write_text("import not_installed_anywhere\n")
    code, log = failed_start(tools_stack, "executor-broken", str(broken))
    assert code != 0 and "Traceback" not in log
    assert log.strip().splitlines()[-1] == (
        f"loopwarden-executor: tool module '{broken}' (from LW_TOOL_MODULES) cannot be imported: "
        "ModuleNotFoundError: No module named 'not_installed_anywhere'"
    )


def test_lint_registers_and_lints_the_generated_contracts(tool_module: Path) -> None:
    env = {**os.environ, "LW_TOOL_MODULES": str(tool_module)}
    env.pop("LW_MCP_SERVERS", None)
    done = subprocess.run(
        [sys.executable, "-m", "loopwarden.cli", "lint"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=bound(120),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 refused, 0 lint note(s)" in done.stdout
    assert not [line for line in done.stdout.splitlines() if "low_stock" in line or "place_order" in line]


# --- a live run, offline ------------------------------------------------------------------------------


def test_the_docs_live_run_completes_against_the_fake_model_command(tools_stack: LocalStack) -> None:
    """docs/tools.md's live-run snippet, as written: the real SDK and planner, the fake-model command."""
    env = {**os.environ, "LW_NATS_URL": tools_stack.nats_url or ""}
    done = subprocess.run(
        [sys.executable, "-c", python_blocks()[1]],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=bound(120),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "completed Done. Called: low_stock, reorder_line."


async def test_a_live_run_with_a_rubric_is_judged_by_the_fake_model(tools_client: Client) -> None:
    rubric = Rubric(
        criteria=[
            Criterion(name="names the low items", hard=True, description="BOLT-M6 and WASHER-M6"),
            Criterion(name="brief"),
        ]
    )
    run = RunSubmit(
        run_id=new_run_id(), task="What is low in the north?", tools=["low_stock", "submit_result"], rubric=rubric
    )
    await tools_client.submit(run)
    state = await tools_client.wait(
        run.run_id, timeout=bound(60), until=("completed", "stopped", "failed", "awaiting_human")
    )
    assert state.status == "completed", state.error  # not judged would wait for a person
    verdicts = payloads(await tools_client.events(run.run_id), "judge.verdict")
    assert [(v["status"], v["score"]) for v in verdicts] == [("passed", 1.0)]
