"""Key-value buckets: reads by direct get, compare-and-swap writes and updates, create-or-get,
listings; values stored by reference (claim checks) when large."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import Callable
from typing import Generic, TypeVar

from nats.aio.client import Client as NatsClient
from nats.errors import NoRespondersError
from nats.js.errors import (
    APIError,
    BucketNotFoundError,
    InvalidKeyError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
)
from nats.js.kv import KeyValue
from pydantic import BaseModel

from shared import opcounts
from shared.bus import natsx
from shared.bus.errors import CasConflict
from shared.bus.infra import ensure_buckets
from shared.bus.publishing import Publishing
from shared.bus.wire import EXPECTED_LAST_SUBJECT_SEQUENCE_HEADER, KV_OP_HEADER, MAX_SUBJECT
from shared.messages.lean import lean_json

M = TypeVar("M", bound=BaseModel)
R = TypeVar("R")


class Unchanged(Generic[R]):
    """Returned by an ``update`` change function that has nothing to write."""

    def __init__(self, result: R) -> None:
        self.result = result


class Buckets(Publishing):
    async def kv(self, bucket: str) -> KeyValue:
        if bucket not in self._kv:
            try:
                self._kv[bucket] = await self.js.key_value(bucket)
            except BucketNotFoundError:
                if not self.settings.manage_streams:
                    raise
                # Unmanaged: created on first use (never changed if it exists).
                await self.until_ready(f"bucket {bucket}", lambda: ensure_buckets(self.js, self.settings, [bucket]))
                self._kv[bucket] = await self.js.key_value(bucket)
        return self._kv[bucket]

    async def kv_get(self, bucket: str, key: str, model: type[M]) -> tuple[M | None, int]:
        """The stored model and its revision (0 when absent)."""
        kv = await self.kv(bucket)
        try:
            value, revision = await self.through_failover(
                f"read {bucket}/{key}", lambda: self._kv_read(kv, key), repeatable=True
            )
        except KeyNotFoundError:
            return None, 0
        if value is None:
            return None, revision
        value = await self.payloads.inflate_value(
            self.broker.connection, value, max_bytes=self.settings.value_limit(bucket)
        )
        return model.model_validate_json(value), revision

    async def _kv_read(self, kv: KeyValue, key: str) -> tuple[bytes | None, int]:
        """(value, revision) of ``key`` as ``KeyValue.get`` reads it - a deleted or purged key is
        ``KeyNotFoundError`` - by a direct get answered through the bus's reply collector."""
        pre = natsx.kv_subject_prefix(kv)
        if not natsx.kv_direct(kv):  # a bucket made without direct gets: nats-py's stream API request
            entry = await kv.get(key)
            return entry.value, entry.revision or 0
        if not natsx.key_valid(key):
            raise InvalidKeyError(key)
        subject = pre + key
        if len(subject) > MAX_SUBJECT:  # no writer makes a key this long (``kv_put``): it is not there
            raise KeyNotFoundError
        direct_get = f"{natsx.api_prefix(self.js)}.DIRECT.GET.{natsx.kv_stream(kv)}.{subject}"
        msg = await self._replies.request(direct_get, b"", None)
        headers = msg.headers or {}
        if not msg.data:
            status = headers.get("Status")
            if status == "404":
                raise KeyNotFoundError
            if status == "503":
                raise NoRespondersError
            if status:
                APIError.from_msg(msg)
        if headers.get("Nats-Subject") != subject:
            raise KeyNotFoundError(message=f"expected '{subject}', but got '{headers.get('Nats-Subject')}'")
        if headers.get(KV_OP_HEADER) in ("DEL", "PURGE"):
            raise KeyNotFoundError
        return (msg.data or None), int(headers.get("Nats-Sequence") or 0)

    async def update(
        self,
        bucket: str,
        key: str,
        model: type[M],
        change: Callable[[M | None], tuple[M, R] | Unchanged[R]],
        attempts: int = 20,
        *,
        known: tuple[M | None, int] | None = None,
        saved: Callable[[M | None, int], None] | None = None,
    ) -> R:
        """Read-modify-write under compare-and-swap: ``change`` gets the current value (None if
        absent) and returns the new value with a result, or ``Unchanged(result)``. A conflict
        (another writer got there first) re-reads and calls ``change`` again, after a jittered backoff
        from the second conflict on.

        ``known`` is a (value, revision) the caller already holds (e.g. what it wrote last): it is
        tried first without reading; ``change`` may mutate it. ``(None, 0)`` guesses the key absent: the
        first write is a create, and a key that exists makes it a conflict, read and decided upon as any.
        ``saved(value, revision)`` is told what is stored once the update is done, so the caller can keep
        it for next time."""
        current: M | None
        for attempt in range(attempts):
            if attempt > 1:  # writers racing for one key (a tenant's day): back off, jittered, so one wins
                await asyncio.sleep(random.uniform(0, min(0.01 * 2**attempt, 0.5)))
            guessed = known is not None
            if known is not None:
                current, revision = known
                known = None
            else:
                current, revision = await self.kv_get(bucket, key, model)
            outcome = change(current)
            if isinstance(outcome, Unchanged):
                if guessed:  # "nothing to do" is only trusted on what is really stored
                    continue
                if saved is not None:
                    saved(current, revision)
                return outcome.result
            new, result = outcome
            try:
                revision = await self.kv_put(bucket, key, new, revision=revision)
            except CasConflict:
                continue
            if saved is not None:
                saved(new, revision)
            return result
        raise CasConflict(f"{bucket}/{key}: still contended after {attempts} attempts")

    async def kv_put(
        self, bucket: str, key: str, value: BaseModel, *, revision: int | None = None, lean: bool = True
    ) -> int:
        """Write ``value``; with ``revision`` it is a compare-and-swap (0 = must not exist yet). ``lean``: its empty
        defaults left out (``lean_json``, ~2.5x the dump's CPU); off for a value the next write soon replaces (a
        running run's record: the bucket keeps only the last), which readers read the same either way."""
        kv = await self.kv(bucket)
        data = (lean_json(value) if lean else value.model_dump_json(by_alias=True)).encode()
        data = await self.payloads.offload_value(self.broker.connection, data)
        pre = natsx.kv_subject_prefix(kv)
        if not natsx.key_valid(key) or len(pre) + len(key) > MAX_SUBJECT:
            raise InvalidKeyError(key[:200])
        subject = pre + key
        try:
            if revision is None:
                ack = await self.through_failover(
                    f"write {bucket}/{key}", lambda: self._js_request(subject, data, None), repeatable=True
                )
                return ack.seq

            async def landed() -> int | None:  # a timed-out compare-and-swap may have been applied
                with contextlib.suppress(KeyNotFoundError):
                    entry = await kv.get(key)
                    if entry.value == data and (entry.revision or 0) > revision:
                        return entry.revision
                return None

            expect = {EXPECTED_LAST_SUBJECT_SEQUENCE_HEADER: str(revision)}

            async def cas() -> int:
                return (await self._js_request(subject, data, expect)).seq

            try:
                return await self.through_failover(f"write {bucket}/{key}", cas, resolve=landed)
            except KeyWrongLastSequenceError:
                if revision != 0:
                    raise
            # The key exists - or only its delete marker does: nats-py's create() recreates a deleted key.
            return await self.through_failover(f"write {bucket}/{key}", lambda: kv.create(key, data), resolve=landed)
        except KeyWrongLastSequenceError as err:
            raise CasConflict(f"{bucket}/{key} changed since revision {revision}") from err
        except Exception as err:  # create() on an existing key
            if "key exists" in str(err).lower() or "wrong last sequence" in str(err).lower():
                raise CasConflict(f"{bucket}/{key} already exists") from err
            raise

    async def kv_put_all(self, bucket: str, items: list[tuple[str, BaseModel]]) -> None:
        """Write several keys (plain puts, no compare-and-swap) as one batch: all are sent before any answer
        is awaited, so they leave in one write with whatever else was sent meanwhile, and their acks are awaited
        together (``_js_publish_many``: what failed over is sent again; a put is repeatable)."""
        if len(items) == 1:
            await self.kv_put(bucket, items[0][0], items[0][1])
            return
        kv = await self.kv(bucket)
        pre = natsx.kv_subject_prefix(kv)
        batch: list[tuple[str, bytes, dict[str, str], bool]] = []
        for key, value in items:
            if not natsx.key_valid(key) or len(pre) + len(key) > MAX_SUBJECT:
                raise InvalidKeyError(key[:200])
            data = lean_json(value).encode()
            data = await self.payloads.offload_value(self.broker.connection, data)
            batch.append((pre + key, data, {}, True))
        await self._js_publish_many(batch)

    async def create_or_get(self, bucket: str, key: str, value: M) -> tuple[M, int, bool]:
        """Store ``value`` unless the key holds something already: (what is stored, its revision,
        whether this call created it). Of two writers racing, the first one's value stands for both."""
        try:
            revision = await self.kv_put(bucket, key, value, revision=0)
        except CasConflict:
            stored, revision = await self.kv_get(bucket, key, type(value))
            return (stored or value), revision, False
        return value, revision, True

    async def keys(self, bucket: str) -> list[str]:
        """Every key of ``bucket`` (``kv_keys``: a key deleted by a marker is listed too; none: an empty list)."""
        await self.kv(bucket)  # created if missing
        return await kv_keys(self.nc, bucket)

    async def kv_values(self, bucket: str, model: type[M]) -> dict[str, M]:
        """Every value in ``bucket`` by key (keys deleted meanwhile are left out)."""
        found: dict[str, M] = {}
        for key in await self.keys(bucket):  # not kv.keys(): it misses keys written meanwhile
            value, _ = await self.kv_get(bucket, key, model)
            if value is not None:
                found[key] = value
        return found


async def kv_keys(nc: NatsClient, bucket: str, timeout: float = 5.0) -> list[str]:
    """Every key of a bucket, from the server's index of the subjects its stream holds (one request per
    100,000 keys, no consumer). A key deleted or purged by a marker is listed too: reading it says so.

    A listing by watching the bucket until nothing more is pending (nats-py's ``KeyValue.keys``, or its
    watcher) misses a key written while it runs: measured, 9 listings in 100 of a 400-key bucket under
    concurrent writes came back one key short (the retention sweep then took a run for one without a
    queue item and purged its audit trail). ``KeyValue.keys`` also leaves its consumer on the server for
    5 minutes, and nats-server caps a stream at 1,000 consumers."""
    prefix = f"$KV.{bucket}."
    keys: list[str] = []
    while True:
        opcounts.count("js_api")
        request = json.dumps({"subjects_filter": f"{prefix}>", "offset": len(keys)}).encode()
        reply = await nc.request(f"$JS.API.STREAM.INFO.KV_{bucket}", request, timeout=timeout)
        info = json.loads(reply.data)
        if "error" in info:
            APIError.from_error(info["error"])  # raises: NotFoundError for a bucket never created
        page = (info.get("state") or {}).get("subjects") or {}
        keys += [subject[len(prefix) :] for subject in page]
        if not page or len(keys) >= int(info.get("total") or 0):
            return keys
