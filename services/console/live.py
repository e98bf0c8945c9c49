"""The console's view of the bus, kept current without reading every key per request: a KV
watcher over ``lw_runs`` and an ordered consumer over the event stream, both indexed in memory.
The queue itself is asked of the escalation service, which keeps its own watched index.

A run's page reads the run's whole record (``loopwarden.records``) once per change of the run: the
record is kept while no new event of the run has arrived. Where the console's user may not read every
bucket of a run (a locked deployment), the record is the run state and the events, which still give
the whole tree of steps; the page says what could not be read."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from typing import Any

from nats.js.api import ConsumerConfig, DeliverPolicy

from loopwarden import records as R
from loopwarden.client import Client
from services.console import board as B
from shared import subjects as S
from shared.bus import RUN_ID_HEADER
from shared.messages import utcnow
from shared.records import RunRecord
from shared.settings import Settings

log = logging.getLogger("loopwarden.console")
MAX_RUNS = 100_000  # run rows held in memory (a row is small); the runs list filters and pages them
MAX_TIMELINES = 2000
MAX_RECORDS = 32


class LiveView:
    def __init__(self, client: Client, settings: Settings | None = None) -> None:
        self.client = client
        self.settings = settings or client.settings
        self._records: OrderedDict[str, tuple[int, str, RunRecord, str | None]] = OrderedDict()
        self.runs: dict[str, B.RunRow] = {}
        self.timelines: OrderedDict[str, B.RunTimeline] = OrderedDict()
        self.failures: dict[str, set[str]] = {}  # run id -> the failure types its tool calls met
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
            self.failures.pop(entry.key, None)
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
        if entry.kind.startswith("failure."):
            self.failures.setdefault(run_id, set()).add(entry.kind.split(".")[1])
        timeline = self.timelines.setdefault(run_id, B.RunTimeline())
        self.timelines.move_to_end(run_id)
        B.add_event(timeline, entry, headers.get("traceparent"))
        while len(self.timelines) > MAX_TIMELINES:
            self.timelines.popitem(last=False)

    def version(self, run_id: str) -> tuple[int, str]:
        """What changes when the run does: its events seen so far and its record's last update."""
        timeline = self.timelines.get(run_id)
        row = self.runs.get(run_id)
        return (len(timeline.entries) if timeline else 0, row.updated_at if row else "")

    async def record(self, run_id: str) -> tuple[RunRecord | None, str | None]:
        """The run's record and, when only part of it could be read, why (None, reason: no such run)."""
        seen, updated = self.version(run_id)
        kept = self._records.get(run_id)
        if kept is not None and kept[:2] == (seen, updated) and seen:
            return kept[2], kept[3]
        note: str | None = None
        try:
            record = await R.export_run(self.client.bus, self.settings, run_id)
        except R.RecordNotFound as err:
            return None, str(err)
        except Exception as err:  # a bucket this user may not read: the events still tell it
            log.info("console: run %s read from its state and events only: %s", run_id, err)
            note = f"model calls, raw tool outputs and stored verdicts are not readable here ({type(err).__name__})"
            try:
                bare = await self._bare_record(run_id)
            except Exception as again:
                return None, f"run {run_id}: cannot read its events: {again}"
            if bare is None:
                return None, f"run {run_id}: no run state (never submitted, or its records expired)"
            record = bare
        self._records[run_id] = (seen, updated, record, note)
        self._records.move_to_end(run_id)
        while len(self._records) > MAX_RECORDS:
            self._records.popitem(last=False)
        return record, note

    async def _bare_record(self, run_id: str) -> RunRecord | None:
        snap = await self.client.state(run_id, history=True)
        if snap is None:
            return None
        events, trace_id = await R.run_events(self.client.bus, run_id)
        state = snap.model_dump(mode="json")
        messages = [m.model_dump(mode="json") for m in snap.messages]  # excluded from the dump: read apart
        return RunRecord(
            run_id=run_id,
            exported_at=utcnow(),
            task=str(state.get("task", "")),
            status=str(state.get("status", "")),
            final_output=state.get("final_output"),
            final_reason=state.get("final_reason"),
            created_at=state.get("created_at"),
            updated_at=state.get("updated_at"),
            trace_id=trace_id,
            provider="live",
            config=dict(state.get("config") or {}),
            usage=dict(state.get("usage") or {}),
            messages=messages,
            events=events,
            state=state,
        )

    def rows(self) -> list[B.RunRow]:
        return sorted(self.runs.values(), key=lambda r: r.updated_at, reverse=True)

    def page(self, flt: B.RunFilter, page: int, now: float) -> B.RunPage:
        return B.select_runs(self.runs.values(), flt, self.failures, now, page)
