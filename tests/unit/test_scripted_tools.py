"""A scripted run's tool (``services/executor/scripted.py``): the scenario's behaviour stands in for the real
tool, or runs it and waits, attempt by attempt; the attempt loop itself knows nothing of scripts (issue 37)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from services.executor.scripted import ScriptedTool
from shared.scenario import parse_scenario
from shared.tools import ToolContext, ToolFailure

ROOT = Path(__file__).resolve().parents[2]
CTX = ToolContext(run_id="run-unit", call_id="c1", attempt=1)


def scripted(behaviours: list[dict[str, Any]]) -> tuple[ScriptedTool, list[dict[str, Any]]]:
    """The tool ``t`` scripted with ``behaviours``, over a real tool that records its calls."""
    scenario = parse_scenario({"name": "x", "task": "t", "tools": {"t": behaviours}})
    ran: list[dict[str, Any]] = []
    cursor = iter(range(100))

    async def real(args: dict[str, Any], ctx: ToolContext) -> Any:
        ran.append(args)
        return {"real": True}

    async def take() -> int:
        return next(cursor)

    return ScriptedTool(scenario, "t", real, take), ran


def test_each_attempt_takes_the_next_behaviour_and_a_spent_script_runs_the_real_tool() -> None:
    tool, ran = scripted(
        [
            {"fail": "transient", "error": "HTTP 503", "retry_after_s": 2},
            {"fail": "timeout", "retry_after_s": 5},
            {"output": {"n": 1}},
            {"output_text": "not json"},
        ]
    )

    async def attempts() -> list[Any]:
        seen: list[Any] = []
        for _ in range(5):
            try:
                seen.append(await tool({"x": 1}, CTX))
            except ToolFailure as failure:
                seen.append((failure.kind, str(failure), failure.retry_after_s))
        return seen

    assert asyncio.run(attempts()) == [
        ("transient", "HTTP 503", 2),
        ("timeout", "scripted timeout failure", None),  # a timeout says no Retry-After
        {"n": 1},
        "not json",
        {"real": True},
    ]
    assert ran == [{"x": 1}]  # the real tool ran only once the script was spent


def test_a_latency_alone_runs_the_real_tool_then_waits() -> None:
    tool, ran = scripted([{"latency_s": 0.2}])
    began = time.monotonic()
    assert asyncio.run(tool({"x": 2}, CTX)) == {"real": True}
    assert ran == [{"x": 2}] and time.monotonic() - began >= 0.2


def test_a_scripted_output_never_reaches_the_real_tool() -> None:
    tool, ran = scripted([{"output": None, "times": "always"}])
    assert asyncio.run(tool({}, CTX)) is None and asyncio.run(tool({}, CTX)) is None
    assert ran == []


@pytest.mark.parametrize("word", ["behaviour", "script", "scenario"])
def test_the_attempt_loop_never_asks_whether_a_run_is_scripted(word: str) -> None:
    text = (ROOT / "services" / "executor" / "attempts.py").read_text().lower()
    assert word not in text, f"services/executor/attempts.py mentions {word!r}: the choice is made once per call"
