"""Which called tools a running executor replica hosts, asked before a turn's calls are dispatched.

A tool is in the contract catalogue (``lw_contracts``) once an executor registered it, and the
catalogue outlives that executor (a stack restarted without the tool's settings keeps it). What
says a replica is there now is its durable (``executor_<tool>``): a live executor always has a pull
request waiting on it, or holds a message it is running. A durable with neither through
``LW_TOOL_HOST_GRACE_S`` (asked again every moment; a restarting replica is back within it), or no
durable at all, is a tool nobody hosts: its call is an ``unknown_tool`` failure
(``outcomes.unknown_tool``) instead of a command that would wait in the stream for ever. When the
server cannot say (a timeout, a leader election), the tool counts as hosted: the call is dispatched
as before.

Off the step's path: a tool seen hosted is asked again in the background once half its TTL has passed
(a step never waits for that lookup while steps keep coming); only a tool not seen hosted within the TTL
(the first call, an idle while, or a background lookup that found nobody pulling) is asked before its
call is dispatched.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable

HOSTED_TTL_S = 1.0  # a tool seen hosted is not asked again this long (one lookup per tool per second at most)

Probe = Callable[[str], Awaitable[bool | None]]
"""True: a replica pulls or holds its calls; False: nobody does (or no durable); None: cannot tell."""


class Hosting:
    def __init__(self, probe: Probe, ttl_s: float = HOSTED_TTL_S, recheck_s: float = 0.3, grace_s: float = 0.0) -> None:
        """``grace_s``: how long a tool nobody pulls is asked again before it counts as unhosted (at least
        once more, ``recheck_s`` later): a replica restarting (a crash, a rolling upgrade) is back within it, and
        its calls wait in the stream as they always did; only a tool still unhosted after it is a failure."""
        self.probe, self.ttl_s, self.recheck_s, self.grace_s = probe, ttl_s, recheck_s, grace_s
        self._hosted_until: dict[str, float] = {}  # per tool: when to ask again
        self._asking: dict[str, asyncio.Task[None]] = {}  # per tool: a lookup in the background

    def ask_ahead(self, tool: str) -> None:
        """Ask whether ``tool`` is still hosted in the background (one lookup per tool at a time)."""
        if tool in self._asking:
            return

        async def ask() -> None:
            try:
                hosted = await self.probe(tool)
            finally:
                self._asking.pop(tool, None)
            if hosted is False:  # nobody pulls it now: the next call asks before it is dispatched
                self._hosted_until.pop(tool, None)
            elif hosted:
                self._hosted_until[tool] = time.monotonic() + self.ttl_s

        self._asking[tool] = asyncio.create_task(ask(), name=f"hosting {tool}")

    async def unhosted(self, tools: Iterable[str]) -> set[str]:
        """The tools among ``tools`` that no running replica hosts."""
        missing: set[str] = set()
        for tool in sorted(set(tools)):
            left = self._hosted_until.get(tool, 0.0) - time.monotonic()
            if left > 0:
                if left < self.ttl_s / 2:
                    self.ask_ahead(tool)
                continue
            hosted = await self.probe(tool)
            give_up = time.monotonic() + self.grace_s
            asked_again = False
            while hosted is False and (not asked_again or time.monotonic() < give_up):
                # between two pull requests of a live replica, or a replica restarting: ask again
                await asyncio.sleep(self.recheck_s)
                hosted = await self.probe(tool)
                asked_again = True
            if hosted is False:
                missing.add(tool)
                self._hosted_until.pop(tool, None)
            else:
                self._hosted_until[tool] = time.monotonic() + self.ttl_s
        return missing
