"""The console's view of the bus, kept current without reading every key per request: a KV
watcher over ``lw_runs`` and an ordered consumer over the event stream, both indexed in memory.
The queue itself is asked of the escalation service, which keeps its own watched index."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from typing import Any

from nats.js.api import ConsumerConfig, DeliverPolicy

from loopwarden.client import Client
from services.console import board as B
from shared import subjects as S
from shared.bus import RUN_ID_HEADER

log = logging.getLogger("loopwarden.console")
MAX_RUNS = 2000


class LiveView:
    def __init__(self, client: Client) -> None:
        self.client = client
        self.runs: dict[str, B.RunRow] = {}
        self.timelines: OrderedDict[str, B.RunTimeline] = OrderedDict()
        self._tasks: list[asyncio.Task[None]] = []
        self._subs: list[Any] = []

    async def start(self) -> None:
        kv = await self.client.bus.kv(S.KV_RUNS)
        watcher = await kv.watchall()
        while True:  # the current runs are in before the first page is served
            entry = await watcher.updates(timeout=30)  # type: ignore[no-untyped-call]
            if entry is None:
                break
            self._apply_run(entry)
        self._tasks.append(asyncio.create_task(self._watch_runs(watcher)))
        sub = await self.client.bus.js.subscribe(
            f"{S.P}.evt.>",
            stream=S.STREAM_EVT,
            cb=self._on_event,
            ordered_consumer=True,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
        )
        self._subs.append(sub)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _watch_runs(self, watcher: Any) -> None:
        async for entry in watcher:
            if entry is not None:
                self._apply_run(entry)

    def _apply_run(self, entry: Any) -> None:
        if entry.operation in ("DEL", "PURGE") or entry.value is None:
            self.runs.pop(entry.key, None)
            return
        self.runs[entry.key] = B.run_row(entry.key, entry.value)
        while len(self.runs) > MAX_RUNS:
            self.runs.pop(next(iter(self.runs)))

    async def _on_event(self, msg: Any) -> None:
        headers = msg.headers or {}
        run_id = headers.get(RUN_ID_HEADER)
        if not run_id:
            return
        meta = msg.metadata
        entry = B.timeline_entry(
            meta.sequence.stream if meta else 0, msg.subject, msg.data, meta.timestamp if meta else None
        )
        timeline = self.timelines.setdefault(run_id, B.RunTimeline())
        self.timelines.move_to_end(run_id)
        B.add_event(timeline, entry, headers.get("traceparent"))
        while len(self.timelines) > MAX_RUNS:
            self.timelines.popitem(last=False)

    def rows(self) -> list[B.RunRow]:
        return sorted(self.runs.values(), key=lambda r: r.updated_at, reverse=True)
