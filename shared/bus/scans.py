"""Reading a stream without a consumer: batched direct gets (``scan``, ``scan_page``, ``scan_all``)
and a bucket's values from a sequence on (``kv_scan``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import APIError

from shared.bus.wire import KV_OP_HEADER

# --- reading a stream without a consumer (batched direct gets) -----------------------------------------
SCAN_BATCH = 256  # messages per batched direct get
SCAN_MAX_BYTES = 8 * 1024 * 1024  # and at most this much per answer (the server stops the batch there)
_DIRECT_HEADERS = (
    "Nats-Stream",
    "Nats-Subject",
    "Nats-Sequence",
    "Nats-Time-Stamp",
    "Nats-Num-Pending",
    "Nats-Last-Sequence",
)


@dataclass(frozen=True)
class Stored:
    """A message as a stream stores it, read by direct get: its subject, sequence, time, headers as
    published (the direct get's own ``Nats-*`` headers taken out) and body."""

    subject: str
    seq: int
    time: datetime | None
    headers: dict[str, str]
    data: bytes


def _stored(msg: Msg) -> Stored:
    headers = dict(msg.headers or {})
    subject = headers.get("Nats-Subject", "")
    seq = int(headers.get("Nats-Sequence") or 0)
    stamp = headers.get("Nats-Time-Stamp")
    for name in _DIRECT_HEADERS:
        headers.pop(name, None)
    at = None
    if stamp:
        with contextlib.suppress(ValueError):  # RFC 3339 with nanoseconds: keep microseconds
            head, _, frac = stamp.rstrip("Z").partition(".")
            at = datetime.fromisoformat(f"{head}.{(frac + '000000')[:6]}+00:00" if frac else f"{head}+00:00")
    return Stored(subject, seq, at, headers, bytes(msg.data or b""))


async def _direct_batch(nc: NatsClient, stream: str, request: dict[str, Any], timeout: float) -> tuple[list[Msg], int]:
    """One batched direct get (``$JS.API.DIRECT.GET.<stream>``, nats-server 2.11+): the messages, then the
    ``204 EOB`` status that ends them and says how many more match (``Nats-Num-Pending``). No match: 404."""
    inbox = nc.new_inbox()  # under this user's inbox prefix (permissions)
    queue: asyncio.Queue[Msg] = asyncio.Queue()

    async def on_msg(msg: Msg) -> None:
        await queue.put(msg)

    sub = await nc.subscribe(inbox, cb=on_msg)
    got: list[Msg] = []
    try:
        await nc.publish(f"$JS.API.DIRECT.GET.{stream}", json.dumps(request).encode(), reply=inbox)
        async with asyncio.timeout(timeout):
            while True:
                msg = await queue.get()
                status = msg.headers.get("Status") if msg.headers else None
                if not status:
                    got.append(msg)
                    continue
                if status == "204":
                    return got, int(msg.headers.get("Nats-Num-Pending") or 0)  # type: ignore[union-attr]
                if status == "404":
                    return got, 0
                if status == "503":
                    raise NoRespondersError
                APIError.from_msg(msg)  # raises
                raise APIError(description=f"direct get on {stream}: status {status}")
    except TimeoutError:
        raise NatsTimeoutError from None
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


async def scan(
    nc: NatsClient, stream: str, subjects: str, start: int = 1, *, batch: int = SCAN_BATCH, timeout: float = 5.0
) -> list[Stored]:
    """The messages ``stream`` holds on ``subjects`` (one filter, wildcards allowed) from sequence ``start``
    on, oldest first: batched direct gets, so a reader needs no consumer - and so no right to create one
    on a stream that holds the services' durables (nats-server takes a create naming an existing durable
    as an update of it). A stream that is missing raises ``NotFoundError``."""
    out: list[Stored] = []
    seq = start
    while True:
        request = {"seq": seq, "next_by_subj": subjects, "batch": batch, "max_bytes": SCAN_MAX_BYTES}
        msgs, pending = await _direct_batch(nc, stream, request, timeout)
        out += [_stored(m) for m in msgs]
        if not msgs or not pending:
            return out
        seq = out[-1].seq + 1


async def scan_page(
    nc: NatsClient,
    stream: str,
    subjects: str,
    start: int = 1,
    *,
    batch: int = SCAN_BATCH,
    max_bytes: int = SCAN_MAX_BYTES,
    timeout: float = 5.0,
) -> tuple[list[Stored], int]:
    """One batch of ``scan``: the messages on ``subjects`` from ``start`` (at most ``batch``, and the server
    stops at ``max_bytes``), and how many more match after them."""
    request = {"seq": start, "next_by_subj": subjects, "batch": batch, "max_bytes": max_bytes}
    msgs, pending = await _direct_batch(nc, stream, request, timeout)
    return [_stored(m) for m in msgs], pending


async def scan_all(nc: NatsClient, stream: str, filters: list[str], start: int = 1, **kw: Any) -> list[Stored]:
    """``scan`` for several filters that never overlap (e.g. ``S.run_filters``), merged in stream order."""
    found = [m for f in filters for m in await scan(nc, stream, f, start, **kw)]
    return sorted(found, key=lambda m: m.seq)


async def kv_scan(nc: NatsClient, bucket: str, keys: str = ">", start: int = 1) -> tuple[dict[str, Stored | None], int]:
    """The values of a bucket's keys matching ``keys`` written from ``start`` on, by key (None: deleted or
    purged since), and the last sequence read (0: none): a listing and a watch without a consumer."""
    prefix = f"$KV.{bucket}."
    found: dict[str, Stored | None] = {}
    last = 0
    for m in await scan(nc, f"KV_{bucket}", prefix + keys, start):
        deleted = m.headers.get(KV_OP_HEADER) in ("DEL", "PURGE")
        found[m.subject[len(prefix) :]] = None if deleted else m
        last = m.seq
    return found, last
