"""A scripted run's tools: the scenario's behaviour stands in for (or around) the real tool, chosen once when a
call starts, so the attempt loop runs one tool function and never asks whether a run is scripted.

Each attempt of a call takes the next behaviour of its tool in the run (a cursor in ``lw_script_cursors``, so
a retry or a replica that takes the call over goes on from where the last attempt left off): an output or a
failure replaces the tool; a latency alone runs the real tool, then waits (a slow answer after the effect).
A run without a scenario, or a tool the scenario does not script, runs the real tool with no wrapper at all.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from services.executor.attempts import Around
from shared import subjects as S
from shared.bus import Bus
from shared.messages import ToolCall, Wire
from shared.providers.select import scripted_tools
from shared.scenario import Scenario
from shared.settings import Settings
from shared.tools import ToolContext, ToolFailure, ToolFn


class Cursor(Wire):
    next: int = 0


@dataclass(frozen=True)
class ScriptedTool:
    """One call's tool in a scripted run, with the ``ToolFn`` interface: each call of it is one attempt."""

    scenario: Scenario
    tool: str
    real: ToolFn
    take: Callable[[], Awaitable[int]]  # the index of this attempt among the tool's attempts in the run

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        behaviour = self.scenario.tool_behaviour(self.tool, await self.take())
        if behaviour is None:  # the script is spent: the real tool from here on
            return await self.real(args, ctx)
        if behaviour.runs_real_tool:
            output = await self.real(args, ctx)
            if behaviour.latency_s:
                await asyncio.sleep(behaviour.latency_s)  # e.g. a slow response after the effect happened
            return output
        await asyncio.sleep(behaviour.latency_s)
        if behaviour.fail is not None:
            detail = behaviour.error or f"scripted {behaviour.fail} failure"
            retry_after_s = None if behaviour.fail == "timeout" else behaviour.retry_after_s
            raise ToolFailure(behaviour.fail, detail, retry_after_s=retry_after_s)
        return behaviour.output_text if behaviour.output_text is not None else behaviour.output


async def scripted_around(bus: Bus, settings: Settings, call: ToolCall) -> Around | None:
    """What stands in for ``call``'s tool: its scenario's behaviour in a scripted run that scripts the tool,
    else nothing (a live run reads no scenario beyond this one cached lookup per call)."""
    scenario = await scripted_tools(bus, settings, call.run_id)
    if scenario is None or call.tool not in scenario.tools:
        return None
    key = S.kv_key(call.run_id, call.tool)

    def step(cursor: Cursor | None) -> tuple[Cursor, int]:  # the n-th attempt of this tool in this run
        index = cursor.next if cursor else 0
        return Cursor(next=index + 1), index

    async def take() -> int:
        return await bus.update(S.KV_SCRIPT_CURSORS, key, Cursor, step)

    return lambda real: ScriptedTool(scenario, call.tool, real, take)
