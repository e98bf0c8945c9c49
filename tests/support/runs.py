"""What several end-to-end test modules build scenarios from and read runs with."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from loopwarden.client import Client
from loopwarden.stack import LocalStack, tail
from shared.messages import Escalation, RunSnapshot
from shared.scenario import parse_scenario
from tests.support.timing import bound, eventually

GOOD_SEARCH = {
    "status": "success",
    "totalCount": 1,
    "results": [{"title": "JetStream de-duplication", "url": "https://docs.nats.io/x", "snippet": "Nats-Msg-Id ..."}],
}


def tool_results(state: RunSnapshot) -> list[Any]:
    """Every tool_result block the model was shown, in order."""
    return [b for m in state.messages if m.role == "user" for b in m.content if b.type == "tool_result"]


def submit(answer: str) -> dict[str, Any]:
    """A scripted model turn that submits ``answer`` through the terminal tool."""
    return {"tool_calls": [{"name": "submit_result", "input": {"answer": answer}}]}


def worded_calc(i: int) -> dict[str, Any]:
    """A model turn that calls the calculator with a long text beside it (history grows fast)."""
    return {
        "tool_calls": [{"name": "calculator", "input": {"expression": f"{i} * 1000 + 7"}}],
        "text": f"Step {i}: " + "working through the numbers carefully. " * 12,
    }


def budget_layers(name: str) -> dict[str, Any]:
    """A scripted run whose growing history crosses the budget's warn, compact and stop thresholds in turn."""
    return {
        "name": name,
        "task": "Add up many things.",
        "planner": [worded_calc(i) for i in range(30)],
        "summaries": ["Steps so far computed i*1000+7 for the first few i; nothing else of note."],
        "limits": {"max_iterations": 30, "context_budget_tokens": 4000, "run_token_budget": 40_000},
    }


def calculator_steps(name: str, steps: int) -> dict[str, Any]:
    """A scripted run of ``steps`` calculator calls, one per turn, then a text answer."""
    return {
        "name": name,
        "task": "Add the numbers one by one, then say done.",
        "planner": [
            *({"tool_calls": [{"name": "calculator", "input": {"expression": f"{k}+1"}}]} for k in range(steps)),
            {"text": "done"},
        ],
        "answer_mode": "text",
        "limits": {"max_iterations": steps + 5},
    }


async def planner_dies(stack: LocalStack, fault: str, label: str) -> None:
    """A planner started with ``LW_FAULT_INJECT=fault`` runs until it exits there (code 70)."""
    dying = stack.start_service("planner", label=label, extra_env={"LW_FAULT_INJECT": fault})
    code = await asyncio.to_thread(dying.popen.wait, 60)
    assert code == 70, tail(dying.log)


async def healthy_planner_finishes(stack: LocalStack, client: Client, run_id: str) -> RunSnapshot:
    """A healthy planner takes the run over; the run as it ended, with that planner stopped again."""
    healthy = stack.start_service("planner", label="planner-healthy")
    try:
        return await client.wait(run_id, timeout=bound(60))
    finally:
        healthy.popen.terminate()
        await asyncio.to_thread(healthy.popen.wait, 15)


async def run_scenario(
    client: Client,
    scenario: dict[str, Any],
    timeout: float = bound(30),
    until: tuple[str, ...] = ("completed", "stopped", "failed"),
) -> RunSnapshot:
    """A scripted run submitted, as it ended (or as it stood at one of ``until``)."""
    run_id = await client.submit_scenario(parse_scenario(scenario))
    return await client.wait(run_id, timeout=timeout, until=until)


async def escalations_of(client: Client, run_id: str, count: int = 1, timeout: float = bound(10)) -> list[Escalation]:
    """The run's open escalations, once ``count`` exist: the queue item is created by the escalation
    service from its own message, a moment after the run's state says it is waiting. Fewer after
    ``timeout``: the ones there are, for the caller's assertion to show."""
    items: list[Escalation] = []

    async def enough() -> bool:
        nonlocal items
        items = (await client.escalations(run_id=run_id)).escalations
        return len(items) >= count

    with contextlib.suppress(AssertionError):
        await eventually(enough, what=f"{count} escalation(s) of {run_id}", within=timeout)
    return items
