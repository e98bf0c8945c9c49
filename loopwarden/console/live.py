"""The console's view of the bus, kept current without reading every key per request: the runs'
records (``lw_runs``) and the event stream, both indexed in memory.

Read by batched direct gets from the last sequence seen (``shared.bus.scan``): the console's user may
create no consumer on any stream (a consumer create can rewrite a service's durable). A core NATS
subscription to the events wakes the reader as soon as something is published; it also looks every
``POLL_S`` seconds, for record changes that publish no event. The queue itself is asked of the
escalation service, which keeps its own watched index.

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

from loopwarden import records as R
from loopwarden.client import Client
from loopwarden.console import board as B
from shared import subjects as S
from shared.bus import RUN_ID_HEADER, Stored, kv_scan, scan
from shared.failures import FailureType, is_failure_type
from shared.messages import utcnow
from shared.records import RunRecord
from shared.settings import Settings

log = logging.getLogger("loopwarden.console")
MAX_RUNS = 100_000  # run rows held in memory (a row is small); the runs list filters and pages them
MAX_TIMELINES = 2000
MAX_RECORDS = 32
POLL_S = 0.5


class LiveView:
    def __init__(self, client: Client, settings: Settings | None = None) -> None:
        self.client = client
        self.settings = settings or client.settings
        self._records: OrderedDict[str, tuple[int, str, RunRecord, str | None]] = OrderedDict()
        self.runs: dict[str, B.RunRow] = {}
        self.timelines: OrderedDict[str, B.RunTimeline] = OrderedDict()
        self.failures: dict[str, set[FailureType]] = {}  # run id -> the failure types its tool calls met
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
        bus = self.client.bus  # started before bootstrap (a managed deployment): waits for the bucket
        await bus.until_ready(f"bucket {S.KV_RUNS}", lambda: bus.kv(S.KV_RUNS))
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
            self.failures.pop(key, None)
            return
        self.runs[key] = B.run_row(key, m.data)
        while len(self.runs) > MAX_RUNS:
            self.runs.pop(next(iter(self.runs)))

    def _on_event(self, m: Stored) -> None:
        run_id = m.headers.get(RUN_ID_HEADER)
        if not run_id:
            return
        entry = B.timeline_entry(m.seq, m.subject, m.data, m.time)
        if entry.kind.startswith("failure.") and is_failure_type(ftype := entry.kind.split(".")[1]):
            self.failures.setdefault(run_id, set()).add(ftype)
        timeline = self.timelines.setdefault(run_id, B.RunTimeline())
        self.timelines.move_to_end(run_id)
        B.add_event(timeline, entry, m.headers.get("traceparent"))
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
