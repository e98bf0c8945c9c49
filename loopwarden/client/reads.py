"""Reading runs: a run's state, its conversation and its stored events, and watching its live events."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from loopwarden.client.connecting import Connection
from loopwarden.client.events import Event, Watch, _json, _Polled
from loopwarden.client.refusals import PermissionDenied, guarded
from loopwarden.record_sources import run_id_ok
from shared import history as H
from shared import subjects as S
from shared.bus import RUN_ID_HEADER, Stored, scan_all
from shared.messages import (
    ChatMessage,
    RunRead,
    RunSnapshot,
)
from shared.payloads import PayloadError

TENANT_POLL_S = 0.2  # how often a tenant-bound client asks again (it reads no live event)


class Reads(Connection):
    """A run's state, history and events, stored and live."""

    def not_for_tenants(self, what: str) -> PermissionDenied:
        """A read only those who read every run may make, asked of a client bound to a tenant (``LW_TENANT``)."""
        tenant = self.settings.tenant
        return PermissionDenied(
            self.identity,
            what,
            f"a client of tenant {tenant} (LW_TENANT={tenant}) reads its own runs, one at a time; "
            "an operator reads every run and the dead letters, with LW_TENANT unset",
        )

    @guarded
    async def state(self, run_id: str, history: bool = False) -> RunSnapshot | None:
        """The run as the planner publishes it (``RunSnapshot``); with ``history``, its
        ``messages`` are read too (from ``lw_history`` and the record's tail)."""
        if self.tenant_bound:
            if not run_id_ok(run_id):  # names no run (and is never sent)
                return None
            reply = await self._read("state", RunRead(run_id=run_id))
            snap = RunSnapshot.model_validate_json(await self._value(reply.record)) if reply.found else None
        else:
            snap, _ = await self.bus.kv_get(S.KV_RUNS, run_id, RunSnapshot)
        if snap is not None and history:
            snap.messages = await self.history(snap)
        return snap

    @guarded
    async def history(self, run: str | RunSnapshot, last: int | None = None) -> list[ChatMessage]:
        """The run's live conversation (or its ``last`` messages), oldest first."""
        if not self.tenant_bound:
            snap = run if isinstance(run, RunSnapshot) else await self.state(run)
            return [] if snap is None else await H.messages(self.bus, snap, last)
        if isinstance(run, RunSnapshot):  # the messages that snapshot names
            start = run.history_start if last is None else max(run.history_start, run.history_len - last)
            read = RunRead(run_id=run.run_id, start=start, end=run.history_len)
        elif not run_id_ok(run):
            return []
        else:
            read = RunRead(run_id=run, last=last)
        out: list[ChatMessage] = []
        while True:  # in pages that each fit in one message
            reply = await self._read("history", read)
            if not reply.found:
                return out
            out += [ChatMessage.model_validate_json(await self._value(i.body)) for i in reply.items]
            if reply.next is None:
                return out
            read = RunRead(run_id=read.run_id, start=reply.next, end=reply.end)

    @guarded
    async def events(
        self, run_id: str | None = None, subjects: str = f"{S.P}.evt.>", timeout: float = 2.0
    ) -> list[Event]:
        """The stored event history (optionally of one run), oldest first. ``subjects`` is a stem or
        stem pattern. One run's history is a server-side filter on the run's subject token
        (``S.run_filters``): the server sends that run's events only, whatever else is stored. Read by
        batched direct gets (``shared.bus.scan``): a reader creates no consumer on the stream. A tenant-bound
        client reads one run's events at a time, through the planner (``rpc.runs.events``), in pages."""
        if self.tenant_bound:
            return await self._run_events_read(run_id, subjects)
        stream = S.stream_for(subjects) or S.STREAM_EVT
        filters = S.run_filters(run_id, subjects) if run_id is not None and stream == S.STREAM_EVT else [subjects]
        nc = self.bus.nc
        # a stream electing a new leader (a node died) answers nothing for a few seconds: read again
        stored = await self.bus.through_failover(
            f"read {subjects}", lambda: scan_all(nc, stream, filters, timeout=max(timeout, 1.0)), repeatable=True
        )
        out: list[Event] = []
        for m in stored:
            if run_id is None or m.headers.get(RUN_ID_HEADER, "") == run_id:
                out.append(await self.event(m))
        return out

    async def _run_events_read(self, run_id: str | None, subjects: str, start: int = 1) -> list[Event]:
        if run_id is None:
            what = (
                "read the dead letters (LW_DLQ)"
                if S.stream_for(subjects) == S.STREAM_DLQ
                else "read every run's events"
            )
            raise self.not_for_tenants(what)
        out: list[Event] = []
        read: int | None = start if run_id_ok(run_id) else None
        while read is not None:
            reply = await self._read("events", RunRead(run_id=run_id, start=read, subjects=subjects))
            if not reply.found:
                break
            for i in reply.items:
                out.append(await self.event(Stored(i.subject, i.seq, i.time, i.headers, json.dumps(i.body).encode())))
            read = reply.next
        return out

    async def event(self, msg: Any) -> Event:
        """A received or stored event message as an ``Event``, its body fetched when it travelled by reference
        (a large tool result: ``shared/payloads.py``); a reference that cannot be had stays as it is."""
        headers = dict(msg.headers or {})
        data = msg.data
        with contextlib.suppress(PayloadError):
            data = await self.bus.payloads.inflate(self.bus.nc, data, headers)
        stored = isinstance(msg, Stored)  # else a core NATS message (``watch``): no sequence, no time
        seq, at = (msg.seq, msg.time) if stored else (0, None)
        return Event(msg.subject, _json(data), headers.get(RUN_ID_HEADER, ""), headers, seq, at)

    @guarded
    async def watch(self, run_id: str) -> Watch:
        """Live events of a run as they are published. Subscribed when this returns (the server has
        the subscription: flushed), so a run submitted after it misses nothing:
        ``async with await client.watch(run_id) as events: ... async for e in events``."""
        watch = Watch(run_id, self.event)
        if self.tenant_bound:  # its user reads no live event: the run's stored events, asked for as they come
            watch.subs = [_Polled(asyncio.create_task(self._poll_events(watch)))]
            return watch
        nc = self.bus.broker.connection
        watch.subs = [await nc.subscribe(subject, cb=watch.on_msg) for subject in S.run_filters(run_id)]
        await nc.flush()
        return watch

    async def _poll_events(self, watch: Watch) -> None:
        after = (await self._run_events_read(watch.run_id, f"{S.P}.evt.>"))[-1:]  # from now on, as a watch does
        start = after[0].seq + 1 if after else 1
        while True:
            await asyncio.sleep(TENANT_POLL_S)
            with contextlib.suppress(TimeoutError):
                for event in await self._run_events_read(watch.run_id, f"{S.P}.evt.>", start):
                    await watch._queue.put(event)
                    start = event.seq + 1
