"""The console's view of the bus, kept current without reading every key per request: the runs'
records (``lw_runs``) and the event stream, both indexed in memory.

Read by batched direct gets from the last sequence seen (``shared.bus.scan``): the console's user may
create no consumer on any stream (a consumer create can rewrite a service's durable). A core NATS
subscription to the events wakes the reader as soon as something is published; it also looks every
``POLL_S`` seconds, for record changes that publish no event. The queue itself is asked of the
escalation service, which keeps its own watched index."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from typing import Any

from loopwarden.client import Client
from services.console import board as B
from shared import subjects as S
from shared.bus import RUN_ID_HEADER, Stored, kv_scan, scan

log = logging.getLogger("loopwarden.console")
MAX_RUNS = 2000
POLL_S = 0.5


class LiveView:
    def __init__(self, client: Client) -> None:
        self.client = client
        self.runs: dict[str, B.RunRow] = {}
        self.timelines: OrderedDict[str, B.RunTimeline] = OrderedDict()
        self._tasks: list[asyncio.Task[None]] = []
        self._subs: list[Any] = []
        self._runs_seq = 0  # the last lw_runs sequence read
        self._events_seq = 0  # the last LW_EVT sequence read
        self._wake = asyncio.Event()

    async def start(self) -> None:
        nc = self.client.bus.nc

        async def wake(_msg: Any) -> None:
            self._wake.set()

        self._subs.append(await nc.subscribe(f"{S.EVENT_PREFIX}.>", cb=wake))  # before reading: nothing missed
        await self.client.bus.kv(S.KV_RUNS)
        await self.refresh()  # the current runs are in before the first page is served
        self._tasks.append(asyncio.create_task(self._follow()))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def refresh(self) -> None:
        """Read what was stored since the last read: records, then events."""
        nc = self.client.bus.nc
        found, last = await kv_scan(nc, S.KV_RUNS, ">", self._runs_seq + 1)
        for key, m in found.items():
            self._apply_run(key, m)
        self._runs_seq = max(self._runs_seq, last)
        for m in await scan(nc, S.STREAM_EVT, f"{S.EVENT_PREFIX}.>", self._events_seq + 1):
            self._on_event(m)
            self._events_seq = m.seq

    async def _follow(self) -> None:
        while True:
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(POLL_S):
                    await self._wake.wait()
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # NATS away for a moment: read again on the next turn
                log.warning("console: live view not refreshed: %r", err)
                await asyncio.sleep(POLL_S)

    def _apply_run(self, key: str, m: Stored | None) -> None:
        if m is None or not m.data:
            self.runs.pop(key, None)
            return
        self.runs[key] = B.run_row(key, m.data)
        while len(self.runs) > MAX_RUNS:
            self.runs.pop(next(iter(self.runs)))

    def _on_event(self, m: Stored) -> None:
        run_id = m.headers.get(RUN_ID_HEADER)
        if not run_id:
            return
        entry = B.timeline_entry(m.seq, m.subject, m.data, m.time)
        timeline = self.timelines.setdefault(run_id, B.RunTimeline())
        self.timelines.move_to_end(run_id)
        B.add_event(timeline, entry, m.headers.get("traceparent"))
        while len(self.timelines) > MAX_RUNS:
            self.timelines.popitem(last=False)

    def rows(self) -> list[B.RunRow]:
        return sorted(self.runs.values(), key=lambda r: r.updated_at, reverse=True)
