"""What several end-to-end test modules build scenarios from and read runs with."""

from __future__ import annotations

import asyncio
from typing import Any

from loopwarden.client import Client
from loopwarden.stack import LocalStack, tail
from shared.messages import RunSnapshot
from tests.support.timing import bound

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
