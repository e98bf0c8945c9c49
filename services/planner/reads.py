"""A tenant-bound client's reads of its own runs: ``lw.v1.rpc.runs.<verb>.<tenant>``, answered by the planner.

The buckets and the stream that hold runs (``lw_runs``, ``lw_history``, ``LW_EVT``) hold every tenant's, and
a NATS grant cannot filter a direct get or a bucket by tenant (run ids and event subjects carry no tenant
token). So a client bound to a tenant gets no read right on them at all, and asks the planner, which owns
the runs' records: the server lets each such client publish only its own tenant's subjects, and the planner
answers only for runs whose stored tenant is the subject's (``readable``). Any other run is answered exactly
as a missing one, so no tenant learns whether another's run exists. Every answer fits in one NATS message:
a long history or event list comes in pages (``fit``, ``merge_pages``), a large value by claim-check
reference - stored again under the tenant's own owner (``S.tenant_bodies``), since a tenant-bound client may
read no one else's bodies (whoever stored them first: the executor a tool result, the client a submit).
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import datetime
from typing import Any

from services.planner.state import RunState
from shared import history
from shared import subjects as S
from shared.bus import RUN_ID_HEADER, Bus, Stored, kv_scan, scan_page
from shared.messages import ErrorReply, RunList, RunQuery, RunRead, RunReadReply, RunSnapshot, StoredItem
from shared.payloads import HEADER_ROOM, REF_HEADER, PayloadError, PayloadStore

NOT_FOUND = RunReadReply(found=False)  # a missing run and another tenant's: the same answer
ENVELOPE = 1024  # the reply's own fields around its items
MAX_SEQ = 2**63 - 1  # the largest stream sequence JetStream reads (a uint64 it parses as a signed number)
# What a run's export reads (``values``), per bucket: its one key (the run id), every key under ``<run>.``, or
# keys named by its events whose stored value must name the run (``run_id``).
RECORD_BUCKETS: dict[str, str] = {
    S.KV_RUNS: "key",
    S.KV_BUDGETS: "key",
    S.KV_SCENARIOS: "key",
    S.KV_MODEL_CALLS: "prefix",
    S.KV_TOOL_LEDGER: "prefix",
    S.KV_HISTORY: "prefix",
    S.KV_VERDICTS: "owned",
    S.KV_ESCALATIONS: "owned",
}
PRIVATE = ("outbox", "applied")  # the planner's own fields of a run's record: not in an export
LIST_YIELD = 500  # a tenant's list yields to the loop every so many records read (the planner keeps stepping)


# --- the rules (pure) ----------------------------------------------------------------------------------------
def tenant_of(subject: str) -> str:
    """The tenant a read subject names (``lw.v1.rpc.runs.<verb>.<tenant>``): the token the server enforced."""
    return subject.rsplit(".", 1)[-1]


def readable(stored_tenant: str | None, tenant: str) -> bool:
    """Whether a run of ``stored_tenant`` (None: a run stored before tenants were recorded, the default
    tenant's) may be read by a client of ``tenant``."""
    return (stored_tenant or S.DEFAULT_TENANT) == tenant


def fit(sizes: list[int], budget: int) -> int:
    """How many of the items (their sizes, in order) go in one answer of ``budget`` bytes: at least one
    (each is at most what one message holds: a larger one travels as a reference)."""
    total = 0
    for n, size in enumerate(sizes):
        total += size + 1
        if total > budget and n > 0:
            return n
    return len(sizes)


def merge_pages(pages: list[tuple[list[Stored], int]]) -> tuple[list[Stored], int | None]:
    """One page of several subject filters that never overlap (``S.run_filters``), each read from the same
    sequence: their messages in stream order, cut after the earliest point where a filter had more to come
    (past it, that filter's messages are not read yet); and the sequence to read on from (None: all read)."""
    cuts = [msgs[-1].seq for msgs, pending in pages if pending and msgs]
    merged = sorted((m for msgs, _ in pages for m in msgs), key=lambda m: m.seq)
    if not cuts:
        return merged, None
    bound = min(cuts)
    return [m for m in merged if m.seq <= bound], bound + 1


def listed(record: dict[str, Any], tenant: str, query: RunQuery, now: float) -> bool:
    """Whether a run's stored record (as JSON) is one of ``tenant``'s runs that ``query`` asks for."""
    config = record.get("config")
    stored = record.get("tenant") or (config.get("tenant") if isinstance(config, dict) else None)
    if not readable(stored, tenant):
        return False
    if query.status is not None and record.get("status") != query.status:
        return False
    if query.agent is not None and record.get("agent") != query.agent:
        return False
    if query.since_s is not None:
        try:
            created = datetime.fromisoformat(str(record.get("created_at")).replace("Z", "+00:00")).timestamp()
        except ValueError:
            return False
        return now - created <= query.since_s
    return True


def newest_first(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The order a list is paged in: newest created first (then by run id, so pages never overlap)."""
    return sorted(records, key=lambda r: (str(r.get("created_at", "")), str(r.get("run_id", ""))), reverse=True)


def owns(value: Any, run_id: str) -> bool:
    """Whether a value read by a key the asker named (a verdict, a queue item) is of ``run_id``."""
    return isinstance(value, dict) and value.get("run_id") == run_id


def _body(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return {"raw": data.decode(errors="replace")}


# --- the handlers --------------------------------------------------------------------------------------------
class RunReads:
    """The planner's answers to ``rpc.runs.<verb>.<tenant>`` (registered with its other handlers)."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus

    def register(self) -> None:
        handlers = {"state": self.on_state, "history": self.on_history, "events": self.on_events}
        handlers["values"] = self.on_values
        for verb in S.RUN_READ_VERBS:
            self.bus.subject_responder(
                subject=f"{S.RUN_READ_PREFIX}.{verb}.*", model=RunRead, reply=lambda reason: ErrorReply(error=reason)
            )(handlers[verb])
        self.bus.subject_responder(
            subject=f"{S.RUN_READ_PREFIX}.{S.RUN_LIST}.*", model=RunQuery, reply=lambda reason: ErrorReply(error=reason)
        )(self.on_list)

    @property
    def budget(self) -> int:
        return self.bus.nc.max_payload - HEADER_ROOM - ENVELOPE

    def _store(self, subject: str) -> PayloadStore:
        """Where the large bodies of this read go: under the asking tenant's own owner."""
        return PayloadStore(self.bus.settings, S.tenant_bodies(tenant_of(subject)))

    async def _run(self, read: RunRead, subject: str) -> RunState | None:
        state, _ = await self.bus.kv_get(S.KV_RUNS, read.run_id, RunState)
        return state if state is not None and readable(state.config.tenant, tenant_of(subject)) else None

    async def _value(self, model: Any, subject: str) -> Any:
        """A value as the answer carries it: itself, or a reference to it when it is too large for one message."""
        data = model.model_dump_json(by_alias=True).encode()
        return json.loads(await self._store(subject).offload_value(self.bus.nc, data))

    async def _event(self, m: Stored, subject: str) -> StoredItem:
        """A stored event as the answer carries it: a body stored by reference is fetched, and referred to again
        under the tenant's owner when it is too large for one message."""
        try:
            data = await self.bus.payloads.inflate(self.bus.nc, m.data, m.headers)
        except PayloadError:  # gone (expired) or bad: handed on as it is stored, the reader says it cannot be had
            return StoredItem(subject=m.subject, seq=m.seq, time=m.time, headers=m.headers, body=_body(m.data))
        headers = {k: v for k, v in m.headers.items() if k != REF_HEADER}
        data = await self._store(subject).offload(self.bus.nc, data, headers)
        return StoredItem(subject=m.subject, seq=m.seq, time=m.time, headers=headers, body=_body(data))

    async def on_state(self, read: RunRead, subject: str) -> RunReadReply:
        state = await self._run(read, subject)
        if state is None:
            return NOT_FOUND
        snapshot = RunSnapshot.model_validate(state.model_dump(include=set(RunSnapshot.model_fields)))
        return RunReadReply(found=True, record=await self._value(snapshot, subject))

    async def on_history(self, read: RunRead, subject: str) -> RunReadReply:
        state = await self._run(read, subject)
        if state is None:
            return NOT_FOUND
        end = min(state.history_len, read.end if read.end is not None else state.history_len)
        if read.start is not None:
            start = read.start
        elif read.last is not None:
            start = state.history_len - read.last
        else:
            start = state.history_start
        start = min(max(start, state.history_start), end)
        items: list[StoredItem] = []
        sizes: list[int] = []
        seq = start
        while seq < end and sum(sizes) <= self.budget:
            if seq >= state.tail_from:
                batch = state.tail[seq - state.tail_from : end - state.tail_from]
            else:
                batch = await history.read(
                    self.bus, state.run_id, seq, min(end, state.tail_from, seq + history.READ_BATCH)
                )
            for message in batch:
                item = StoredItem(seq=seq, body=await self._value(message, subject))
                items.append(item)
                sizes.append(len(item.model_dump_json()))
                seq += 1
        n = fit(sizes, self.budget)
        return RunReadReply(
            found=True, items=items[:n], start=start, end=end, next=start + n if start + n < end else None
        )

    async def on_events(self, read: RunRead, subject: str) -> RunReadReply:
        if await self._run(read, subject) is None:
            return NOT_FOUND
        nc, start = self.bus.nc, min(read.start or 1, MAX_SEQ)  # past it JetStream fails the read: nothing there
        filters = S.run_filters(read.run_id, read.subjects)
        pages = [await scan_page(nc, S.STREAM_EVT, f, start, max_bytes=self.budget) for f in filters]
        stored, after = merge_pages(pages)
        items = [
            await self._event(m, subject)
            for m in stored
            if m.headers.get(RUN_ID_HEADER, "") == read.run_id  # a run token is a bounded id: the header is the id
        ]
        n = fit([len(i.model_dump_json()) for i in items], self.budget)
        if n < len(items):
            after = items[n].seq
        return RunReadReply(found=True, items=items[:n], next=after)

    async def _stored_value(self, m: Stored | None, subject: str) -> Any:
        """A bucket's value as JSON (fetched when stored by reference), None when deleted or unreadable."""
        if m is None or not m.data:
            return None
        try:
            return json.loads(await self.bus.payloads.inflate_value(self.bus.nc, m.data))
        except (PayloadError, ValueError):
            return None

    async def _item(self, key: str, value: Any, subject: str) -> StoredItem:
        data = json.dumps(value, separators=(",", ":")).encode()
        return StoredItem(subject=key, body=json.loads(await self._store(subject).offload_value(self.bus.nc, data)))

    async def on_values(self, read: RunRead, subject: str) -> RunReadReply:
        """What the run left in one of its buckets (``RECORD_BUCKETS``), for its export: the run's own key,
        every key under ``<run>.`` in pages (``start``: the index of the first key), or the key ``read.key``
        names when its value is of this run. Anything else, like another tenant's run, is ``NOT_FOUND``."""
        how = RECORD_BUCKETS.get(read.bucket or "")
        if how is None or read.bucket is None or await self._run(read, subject) is None:
            return NOT_FOUND
        bucket, nc, run = read.bucket, self.bus.nc, S.kv_key(read.run_id)
        if how == "prefix":
            found, _ = await kv_scan(nc, bucket, f"{run}.>")
            keys = sorted(k for k, m in found.items() if m is not None)
            start = min(read.start or 0, len(keys))
            items: list[StoredItem] = []
            sizes: list[int] = []
            at: list[int] = []  # each item's index in ``keys``
            i = start
            while i < len(keys) and sum(sizes) <= self.budget:
                value = await self._stored_value(found[keys[i]], subject)
                if value is not None:
                    items.append(await self._item(keys[i], value, subject))
                    sizes.append(len(items[-1].model_dump_json()))
                    at.append(i)
                i += 1
            n = fit(sizes, self.budget)
            after = at[n] if n < len(items) else (i if i < len(keys) else None)
            return RunReadReply(found=True, items=items[:n], next=after)
        key = run if how == "key" else read.key
        if key is None or key != S.kv_key(key):
            return NOT_FOUND
        found, _ = await kv_scan(nc, bucket, key)
        value = await self._stored_value(found.get(key), subject)
        if value is None or (how == "owned" and not owns(value, read.run_id)):
            return RunReadReply(found=True)  # the run is there; this value is not (or not the run's)
        if bucket == S.KV_RUNS and isinstance(value, dict):
            value = {k: v for k, v in value.items() if k not in PRIVATE}
        return RunReadReply(found=True, items=[await self._item(key, value, subject)])

    async def on_list(self, query: RunQuery, subject: str) -> RunList:
        """One page of the asking tenant's runs, newest first: every run record is read (a tenant's runs carry no
        tenant token in their keys), the tenant's kept, one page answered (each run by reference when large)."""
        tenant, now = tenant_of(subject), time.time()
        found, _ = await kv_scan(self.bus.nc, S.KV_RUNS)
        mine: list[dict[str, Any]] = []
        for n, m in enumerate(found.values()):
            if n % LIST_YIELD == LIST_YIELD - 1:
                await asyncio.sleep(0)
            record = await self._stored_value(m, subject)
            if isinstance(record, dict) and listed(record, tenant, query, now):
                mine.append(record)
        ordered = newest_first(mine)
        page: list[Any] = []
        for record in ordered[query.offset : query.offset + query.limit]:
            try:
                snapshot = RunSnapshot.model_validate(record)
            except ValueError:
                continue  # a record this version cannot read is left out, as the direct listing does
            page.append(await self._value(snapshot, subject))
        n = fit([len(json.dumps(r)) for r in page], self.budget)
        shown = query.offset + n if n < len(page) else query.offset + query.limit
        return RunList(runs=page[:n], total=len(ordered), next=shown if shown < len(ordered) else None)
