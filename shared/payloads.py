"""Claim check: a body too big for one NATS message travels by reference through the stream LW_PAYLOADS.

A message body (or a KV value) above ``LW_PAYLOAD_INLINE_LIMIT_BYTES`` — capped below the
server's ``max_payload`` — is stored under its SHA-256 by the user that sends it, in chunks of
``CHUNK_BYTES``: chunk ``n`` on ``lw.v1.payload.<user>.<sha256>.<n>`` (content-addressed: the same
body is stored once, a redelivery re-publishes the same reference), and a small reference goes in
its place:

* on a message, the reference is the body and the ``Lw-Payload-Ref`` header names the object;
* in a KV value (no headers there), the value is ``{"$lw_payload_ref": {...}}``.

Written once, never replaced: each user may publish under its own ``<user>`` token only (its grant),
and the stream keeps one message per subject and refuses a second (``discard: new`` per subject), so
no one can swap the body a stored reference points to; the stream is bounded (``LW_PAYLOAD_MAX_BYTES``)
and the bodies expire with the streams (``LW_STREAM_MAX_AGE_S``). Readers fetch the chunks by direct
get and check the digest against the reference: a reference yields only the body it was made for, and
a missing or bad body is a ``PayloadError`` for that message alone (its handler dead-letters it with the
reason). ``bounded`` keeps a bounded form of a large value where it must stay small (the run state).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import weakref

from nats.aio.client import Client as NatsClient
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import APIError
from pydantic import BaseModel, Field

from shared import opcounts
from shared import subjects as S
from shared.settings import Settings

STREAM = S.STREAM_PAYLOADS
REF_HEADER = "Lw-Payload-Ref"
KV_REF_KEY = "$lw_payload_ref"
_KV_REF_PREFIX = b'{"' + KV_REF_KEY.encode() + b'"'
HEADER_ROOM = 16 * 1024  # headers (trace context, ids) travel beside the body within max_payload
CHUNK_BYTES = 256 * 1024  # fixed, so a body is always cut the same way (a re-publish writes the same chunks)
MAX_CONSUMERS = 8  # nothing consumes this stream (reads are direct gets): room for an admin's tools only
# Chunks one connection fetches or stores at once, whatever the number of bodies in flight: at most 4 MiB of
# answers pending on it (nats-server cuts a connection off as a slow consumer past its 64 MiB ``max_pending``;
# a body of 254 chunks fetched all at once did, and every request and message the service held then failed).
CHUNKS_IN_FLIGHT = 16
_SLOTS: weakref.WeakKeyDictionary[NatsClient, asyncio.Semaphore] = weakref.WeakKeyDictionary()


def chunk_slots(nc: NatsClient) -> asyncio.Semaphore:
    """The chunk fetches and stores ``nc`` may have in flight (shared by every store on that connection)."""
    slots = _SLOTS.get(nc)
    if slots is None:
        slots = _SLOTS[nc] = asyncio.Semaphore(CHUNKS_IN_FLIGHT)
    return slots


# How JetStream refuses a publish on a subject that holds its one message already (its err_code, 10077, is
# the one of every store refusal - "maximum bytes exceeded" too - so the description tells them apart)
SUBJECT_FULL = "maximum messages per subject exceeded"


class PayloadError(Exception):
    """A referenced body cannot be had: missing (expired) object, or content that does not match."""


class PayloadTooLarge(PayloadError):
    """A referenced body over the reader's limit for its message type: refused before it is fetched."""


class PayloadRef(BaseModel):
    """What travels instead of a large body."""

    name: str = Field(description="object name: sha256-<hex of the body>")
    size: int = Field(ge=0)
    sha256: str
    owner: str = Field("", description="the user that stored it: its chunks are under lw.v1.payload.<owner>")


def ref_for(body: bytes, owner: str = "") -> PayloadRef:
    digest = hashlib.sha256(body).hexdigest()
    return PayloadRef(name=f"sha256-{digest}", size=len(body), sha256=digest, owner=owner)


def chunks(size: int) -> int:
    """How many chunks a body of ``size`` bytes is stored in (an empty body: one, empty)."""
    return max(1, -(-size // CHUNK_BYTES))


def inline_limit(settings: Settings, max_payload: int) -> int:
    """The largest body sent inline: the setting, but never more than the server accepts."""
    return max(1024, min(settings.payload_inline_limit_bytes, max_payload - HEADER_ROOM))


def stream_config(settings: Settings) -> StreamConfig:
    """LW_PAYLOADS: one message per subject, written once, bounded, read by direct get."""
    return StreamConfig(
        name=STREAM,
        description="large message bodies and KV values, by reference (claim check), written once",
        subjects=S.STREAM_SUBJECTS[STREAM],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        max_age=settings.stream_max_age_s,
        max_bytes=settings.payload_max_bytes,
        duplicate_window=settings.duplicate_window_s,  # unused (no message ids): declared, so no drift
        max_msgs_per_subject=1,
        discard=DiscardPolicy.NEW,
        discard_new_per_subject=True,
        max_consumers=MAX_CONSUMERS,
        num_replicas=settings.kv_replicas,
        allow_direct=True,
    )


class PayloadStore:
    """The claim-check operations of one process (the bus helper holds one), as NATS user ``owner``."""

    def __init__(self, settings: Settings, owner: str = "") -> None:
        self.settings = settings
        self.owner = S.payload_owner(owner or settings.nats_user or "anonymous")

    def too_big(self, nc: NatsClient, size: int) -> bool:
        return size > inline_limit(self.settings, nc.max_payload)

    async def put(self, nc: NatsClient, body: bytes) -> PayloadRef:
        ref = ref_for(body, self.owner)
        n = chunks(len(body))
        await asyncio.gather(
            *(
                self._put_chunk(
                    nc, S.payload_subject(self.owner, ref.sha256, i), body[i * CHUNK_BYTES : (i + 1) * CHUNK_BYTES]
                )
                for i in range(n)
            )
        )
        return ref

    async def _put_chunk(self, nc: NatsClient, subject: str, data: bytes) -> None:
        headers = {"Nats-Expected-Stream": STREAM}
        opcounts.count("payload_put")
        async with chunk_slots(nc):
            reply = await nc.request(subject, data, timeout=self.settings.js_timeout_s, headers=headers)
        status = reply.headers.get("Status") if reply.headers else None
        if not reply.data and status == "503":
            raise PayloadError(f"{STREAM} is not there (has `loopwarden bootstrap` run?)")
        try:
            ack = json.loads(reply.data)
        except ValueError as err:
            raise PayloadError(f"unreadable answer storing {subject}: {reply.data[:200]!r}") from err
        error = ack.get("error") if isinstance(ack, dict) else None
        if error is None:
            return
        if SUBJECT_FULL in str(error.get("description") or "").lower():
            return  # content-addressed and written once: the same chunk is stored already
        APIError.from_error(error)  # raises it as JetStream's error (e.g. "maximum bytes exceeded": the store is full)
        raise PayloadError(f"{STREAM} refused {subject}: {error}")

    async def get(self, nc: NatsClient, ref: PayloadRef) -> bytes:
        if ref.name != f"sha256-{ref.sha256}":
            raise PayloadError(f"referenced body {ref.name} does not match its digest")
        owner = S.payload_owner(ref.owner or self.owner)
        parts = await asyncio.gather(
            *(self._get_chunk(nc, S.payload_subject(owner, ref.sha256, i), ref) for i in range(chunks(ref.size)))
        )
        body = b"".join(parts)
        if hashlib.sha256(body).hexdigest() != ref.sha256:
            raise PayloadError(f"referenced body {ref.name} does not match its digest")
        return body

    async def _get_chunk(self, nc: NatsClient, subject: str, ref: PayloadRef) -> bytes:
        opcounts.count("payload_fetch")
        async with chunk_slots(nc):
            reply = await nc.request(f"$JS.API.DIRECT.GET.{STREAM}.{subject}", b"", timeout=self.settings.js_timeout_s)
        status = reply.headers.get("Status") if reply.headers else None
        if status:
            raise PayloadError(f"referenced body {ref.name} ({ref.size} bytes) is not in {STREAM} ({status})")
        if len(reply.data or b"") > CHUNK_BYTES:
            raise PayloadError(f"referenced body {ref.name} has a chunk over {CHUNK_BYTES} bytes")
        return bytes(reply.data or b"")

    # --- messages ------------------------------------------------------------------------------
    async def offload(self, nc: NatsClient, body: bytes, headers: dict[str, str]) -> bytes:
        """The body to publish: ``body`` itself, or a reference to it (and the header saying so)."""
        if not self.too_big(nc, len(body)):
            return body
        ref = await self.put(nc, body)
        headers[REF_HEADER] = ref.name
        return ref.model_dump_json().encode()

    async def inflate(
        self, nc: NatsClient, data: bytes, headers: dict[str, str] | None, max_bytes: int | None = None
    ) -> bytes:
        """The body a message stands for (fetched when it is a reference); a body over ``max_bytes`` is refused,
        a reference by its declared size before anything is fetched (the chunks read follow from that size, and
        each is at most ``CHUNK_BYTES``: what is read is bounded by it)."""
        if not headers or REF_HEADER not in headers:
            if max_bytes is not None and len(data) > max_bytes:
                raise PayloadTooLarge(
                    f"the body is {len(data)} bytes, over the limit of {max_bytes} (LW_BODY_MAX_BYTES)"
                )
            return data
        try:
            ref = PayloadRef.model_validate_json(data)
        except ValueError as err:
            raise PayloadError(f"the {REF_HEADER} header is set but the body is not a reference") from err
        if ref.name != headers[REF_HEADER]:
            raise PayloadError(f"the {REF_HEADER} header ({headers[REF_HEADER]}) does not name the body's reference")
        if max_bytes is not None and ref.size > max_bytes:
            raise PayloadTooLarge(f"the body is {ref.size} bytes, over the limit of {max_bytes} (LW_BODY_MAX_BYTES)")
        body = await self.get(nc, ref)
        if len(body) != ref.size:
            raise PayloadError(f"referenced body {ref.name} is {len(body)} bytes, not the {ref.size} it declared")
        return body

    # --- KV values ------------------------------------------------------------------------------
    async def offload_value(self, nc: NatsClient, value: bytes) -> bytes:
        if not self.too_big(nc, len(value)):
            return value
        ref = await self.put(nc, value)
        return json.dumps({KV_REF_KEY: ref.model_dump()}, separators=(",", ":")).encode()

    async def inflate_value(self, nc: NatsClient, value: bytes, max_bytes: int | None = None) -> bytes:
        """The value a KV entry stands for (fetched when it is a reference); a reference to a value over
        ``max_bytes`` is refused by its declared size before anything is fetched (``LW_VALUE_MAX_BYTES``)."""
        if not value.startswith(_KV_REF_PREFIX):
            return value
        try:
            ref = PayloadRef.model_validate(json.loads(value)[KV_REF_KEY])
        except (ValueError, KeyError, TypeError) as err:
            raise PayloadError("a KV value looks like a payload reference but is not one") from err
        if max_bytes is not None and ref.size > max_bytes:
            raise PayloadTooLarge(f"the value is {ref.size} bytes, over the limit of {max_bytes} (LW_VALUE_MAX_BYTES)")
        body = await self.get(nc, ref)
        if len(body) != ref.size:
            raise PayloadError(f"referenced value {ref.name} is {len(body)} bytes, not the {ref.size} it declared")
        return body
