"""Claim check: a body too big for one NATS message travels by reference through the Object Store.

A message body (or a KV value) above ``LW_PAYLOAD_INLINE_LIMIT_BYTES`` — capped below the
server's ``max_payload`` — is stored once in the JetStream Object Store bucket ``lw_payloads``
under its SHA-256 (content-addressed: the same body is stored once, a redelivery re-publishes
the same reference), and a small reference goes in its place:

* on a message, the reference is the body and the ``Lw-Payload-Ref`` header names the object;
* in a KV value (no headers there), the value is ``{"$lw_payload_ref": {...}}``.

Readers inflate before they validate; the Object Store checks the digest while reading and so
do we, against the name, so a reference can only ever yield the body it was made for. The
objects expire with the streams (``LW_STREAM_MAX_AGE_S``). ``bounded`` keeps a bounded form of
a large value where it must stay small (the planner's run state).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.js.api import ObjectStoreConfig, StorageType
from nats.js.client import JetStreamContext
from nats.js.errors import BucketNotFoundError, ObjectNotFoundError
from nats.js.object_store import ObjectStore
from pydantic import BaseModel, Field

from shared.messages import ToolOutcome
from shared.settings import Settings

BUCKET = "lw_payloads"
REF_HEADER = "Lw-Payload-Ref"
KV_REF_KEY = "$lw_payload_ref"
_KV_REF_PREFIX = b'{"' + KV_REF_KEY.encode() + b'"'
HEADER_ROOM = 16 * 1024  # headers (trace context, ids) travel beside the body within max_payload


class PayloadError(Exception):
    """A referenced body cannot be had: missing (expired) object, or content that does not match."""


class PayloadTooLarge(PayloadError):
    """A referenced body over the reader's limit for its message type: refused before it is fetched."""


class PayloadRef(BaseModel):
    """What travels instead of a large body."""

    name: str = Field(description="object name: sha256-<hex of the body>")
    size: int
    sha256: str


def ref_for(body: bytes) -> PayloadRef:
    digest = hashlib.sha256(body).hexdigest()
    return PayloadRef(name=f"sha256-{digest}", size=len(body), sha256=digest)


def inline_limit(settings: Settings, max_payload: int) -> int:
    """The largest body sent inline: the setting, but never more than the server accepts."""
    return max(1024, min(settings.payload_inline_limit_bytes, max_payload - HEADER_ROOM))


async def ensure_store(js: JetStreamContext, settings: Settings, *, create: bool | None = None) -> ObjectStore:
    """The payload bucket: created when missing if ``create`` (default: when this process manages
    streams; ``loopwarden bootstrap`` always does), else it must exist."""
    try:
        return await js.object_store(BUCKET)
    except BucketNotFoundError:
        if not (settings.manage_streams if create is None else create):
            raise
    return await js.create_object_store(
        BUCKET,
        ObjectStoreConfig(
            description="large message bodies and KV values, by reference (claim check)",
            ttl=settings.stream_max_age_s,
            storage=StorageType.FILE,
            replicas=settings.kv_replicas,
        ),
    )


class PayloadStore:
    """The claim-check operations of one process (the bus helper holds one)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._store: ObjectStore | None = None

    async def store(self, nc: NatsClient) -> ObjectStore:
        if self._store is None:
            self._store = await ensure_store(nc.jetstream(), self.settings)
        return self._store

    def too_big(self, nc: NatsClient, size: int) -> bool:
        return size > inline_limit(self.settings, nc.max_payload)

    async def put(self, nc: NatsClient, body: bytes) -> PayloadRef:
        ref = ref_for(body)
        store = await self.store(nc)
        try:
            info = await store.get_info(ref.name)
            if info.size == ref.size:
                return ref  # content-addressed: already stored (e.g. a re-publish after a crash)
        except ObjectNotFoundError:
            pass
        await store.put(ref.name, body)
        return ref

    async def get(self, nc: NatsClient, ref: PayloadRef, max_bytes: int | None = None) -> bytes:
        store = await self.store(nc)
        try:
            if max_bytes is not None:  # the stored size, not only the reference's word: checked before reading
                stored = (await store.get_info(ref.name)).size or 0
                if stored > max_bytes:
                    raise PayloadTooLarge(
                        f"the body is {stored} bytes, over the limit of {max_bytes} (LW_BODY_MAX_BYTES)"
                    )
            result = await store.get(ref.name)  # checks the object's own digest while reading
        except ObjectNotFoundError as err:
            raise PayloadError(f"referenced body {ref.name} ({ref.size} bytes) is not in {BUCKET}") from err
        body = bytes(result.data or b"")
        if hashlib.sha256(body).hexdigest() != ref.sha256 or ref.name != f"sha256-{ref.sha256}":
            raise PayloadError(f"referenced body {ref.name} does not match its digest")
        return body

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
        """The body a message stands for (fetched when it is a reference); a reference to a body over
        ``max_bytes`` is refused by its declared and its stored size, before the body is fetched."""
        if not headers or REF_HEADER not in headers:
            return data
        try:
            ref = PayloadRef.model_validate_json(data)
        except ValueError as err:
            raise PayloadError(f"the {REF_HEADER} header is set but the body is not a reference") from err
        if ref.name != headers[REF_HEADER]:
            raise PayloadError(f"the {REF_HEADER} header ({headers[REF_HEADER]}) does not name the body's reference")
        if max_bytes is not None and ref.size > max_bytes:
            raise PayloadTooLarge(f"the body is {ref.size} bytes, over the limit of {max_bytes} (LW_BODY_MAX_BYTES)")
        body = await self.get(nc, ref, max_bytes)
        if len(body) != ref.size:
            raise PayloadError(f"referenced body {ref.name} is {len(body)} bytes, not the {ref.size} it declared")
        return body

    # --- KV values ------------------------------------------------------------------------------
    async def offload_value(self, nc: NatsClient, value: bytes) -> bytes:
        if not self.too_big(nc, len(value)):
            return value
        ref = await self.put(nc, value)
        return json.dumps({KV_REF_KEY: ref.model_dump()}, separators=(",", ":")).encode()

    async def inflate_value(self, nc: NatsClient, value: bytes) -> bytes:
        if not value.startswith(_KV_REF_PREFIX):
            return value
        try:
            ref = PayloadRef.model_validate(json.loads(value)[KV_REF_KEY])
        except (ValueError, KeyError, TypeError) as err:
            raise PayloadError("a KV value looks like a payload reference but is not one") from err
        return await self.get(nc, ref)


# --- bounded forms (pure) ---------------------------------------------------------------------------


def bounded(value: Any, max_bytes: int) -> tuple[Any, int | None]:
    """``value`` if its JSON fits in ``max_bytes``; else its JSON cut to that size as text, with a note,
    and the full size. For state that must stay small whatever a tool returned."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    size = len(text.encode())
    if size <= max_bytes:
        return value, None
    head = text.encode()[:max_bytes].decode("utf-8", errors="ignore")
    note = f"\n[truncated: the full result is {size} bytes; the first {len(head.encode())} are kept here]"
    return head + note, size


def bounded_outcome(outcome: ToolOutcome, max_bytes: int) -> ToolOutcome:
    """The outcome with its ``data`` in bounded form (what the planner keeps in its KV-stored run state)."""
    data, size = bounded(outcome.data, max_bytes)
    return outcome if size is None else outcome.model_copy(update={"data": data})
