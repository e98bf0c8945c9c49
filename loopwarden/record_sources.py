"""Where a run's record is read from (``RunSource``): the server directly (``Direct``, for the users who read
every run: an operator, the console, the default tenant's client, the admin), or the planner's answers for a
tenant-bound client (``loopwarden.client.exports``). Every id is matched before it reaches a key or a subject
(``run_id_ok``, ``key_ok``): one that is not a run id names no run."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from pydantic import RootModel

from shared import subjects as S
from shared.bus import RUN_ID_HEADER, Bus, kv_scan, natsx, scan_all
from shared.messages import RUN_ID_PATTERN
from shared.records import EventRecord


def run_id_ok(run_id: str) -> bool:
    """Whether ``run_id`` is a run id at all (``RUN_ID_PATTERN``): anything else names no run, and never
    reaches a subject or a key (a 5,000-character id in a URL would pass nats-server's control line)."""
    return re.fullmatch(RUN_ID_PATTERN, run_id) is not None


def key_ok(key: str) -> bool:
    """Whether ``key`` is one a bucket can hold (bounded, and valid): anything else is simply not there."""
    return 0 < len(key) <= S.MAX_KEY and natsx.key_valid(key)


class _Json(RootModel[Any]):
    pass


def _as_dict(data: Any) -> dict[str, Any]:
    return data if isinstance(data, dict) else {"value": data}


class RunSource(Protocol):
    """Where a run's record is read from: the server directly (``Direct``, for those who read every run), or
    the planner's answers for a tenant-bound client (``loopwarden.client.exports``)."""

    async def value(self, bucket: str, key: str, run_id: str) -> dict[str, Any] | None: ...

    async def prefixed(self, bucket: str, run_id: str) -> dict[str, dict[str, Any]]: ...

    async def events(self, run_id: str) -> tuple[list[EventRecord], str | None]: ...


@dataclass
class Direct:
    """Reading a run's record by direct gets, as a user who reads every run does (``RECORD_READS``)."""

    bus: Bus

    async def value(self, bucket: str, key: str, run_id: str) -> dict[str, Any] | None:
        if not key_ok(key):
            return None
        value, _ = await self.bus.kv_get(bucket, key, _Json)
        return None if value is None else _as_dict(value.root)

    async def prefixed(self, bucket: str, run_id: str) -> dict[str, dict[str, Any]]:
        return await prefixed_values(self.bus, bucket, S.kv_key(run_id))

    async def events(self, run_id: str) -> tuple[list[EventRecord], str | None]:
        return await run_events(self.bus, run_id)


def event_record(subject: str, seq: int, time: datetime | None, body: bytes) -> EventRecord:
    try:
        payload = json.loads(body)
    except ValueError:
        payload = {"raw": body.decode(errors="replace")}
    return EventRecord(
        subject=subject,
        kind=S.stem(subject).removeprefix(f"{S.EVENT_PREFIX}."),
        seq=seq,
        time=time,
        payload=_as_dict(payload),
    )


def trace_id_of(headers: dict[str, str]) -> str | None:
    tp = headers.get("traceparent")
    return tp.split("-")[1] if tp and tp.count("-") >= 3 else None


async def run_events(bus: Bus, run_id: str) -> tuple[list[EventRecord], str | None]:
    """The run's events, oldest first (a server-side filter on the run token, read by batched direct gets:
    no consumer), and its trace id."""
    out: list[EventRecord] = []
    trace_id: str | None = None
    for m in await scan_all(bus.nc, S.STREAM_EVT, S.run_filters(run_id)):
        headers = m.headers
        if headers.get(RUN_ID_HEADER, run_id) != run_id:
            continue
        out.append(event_record(m.subject, m.seq, m.time, await bus.payloads.inflate(bus.nc, m.data, headers)))
        trace_id = trace_id or trace_id_of(headers)
    return out, trace_id


async def prefixed_values(bus: Bus, bucket: str, prefix: str) -> dict[str, dict[str, Any]]:
    """Every current value under ``<prefix>.>`` (a server-side filter, batched direct gets), by key."""
    await bus.kv(bucket)  # created if missing (unmanaged), else it must exist
    found, _ = await kv_scan(bus.nc, bucket, f"{S.kv_key(prefix)}.>")
    out: dict[str, dict[str, Any]] = {}
    for key, m in found.items():
        if m is not None and m.data:
            out[key] = _as_dict(json.loads(await bus.payloads.inflate_value(bus.nc, m.data)))
    return out
