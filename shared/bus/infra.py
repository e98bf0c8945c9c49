"""Infrastructure: the declared streams, buckets and consumers, creating what is missing (or, for
``loopwarden bootstrap``, updating what drifted), and waiting until what a process needs exists."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import AckPolicy as JsAckPolicy
from nats.js.api import (
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
    SubjectTransform,
)
from nats.js.client import JetStreamContext
from nats.js.errors import (
    APIError,
    BucketNotFoundError,
    NoStreamResponseError,
    NotFoundError,
)

from shared import subjects as S
from shared.bus.errors import InfrastructureNotReady, describe_nats_error
from shared.bus.wire import last_delivery
from shared.payloads import stream_config as payload_stream_config
from shared.permissions import GRANTS
from shared.settings import Settings

log = logging.getLogger("loopwarden.bus")
R = TypeVar("R")


@dataclass(frozen=True)
class ConsumerSpec:
    stream: str
    durable: str
    filter_subjects: tuple[str, ...]
    service: str = ""  # whose durable: its max_ack_pending follows that service's concurrency


def consumer_config(spec: ConsumerSpec, settings: Settings) -> ConsumerConfig:
    """The one consumer config: what ``loopwarden bootstrap`` creates and a service expects."""
    return ConsumerConfig(
        durable_name=spec.durable,
        ack_policy=JsAckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.ALL,
        ack_wait=settings.ack_wait_s,
        max_deliver=last_delivery(settings.max_deliver),  # we dead-letter at max_deliver ourselves (wire.py)
        filter_subjects=list(spec.filter_subjects),
        max_ack_pending=settings.ack_pending_for(spec.service),
    )


def consumer_drift(actual: ConsumerConfig, wanted: ConsumerConfig) -> str:
    """What differs between a consumer's stored config and the declared one ('' if nothing)."""
    diffs = []
    actual_filters = sorted(actual.filter_subjects or ([actual.filter_subject] if actual.filter_subject else []))
    if actual_filters != sorted(wanted.filter_subjects or []):
        diffs.append(f"filter {actual_filters} != {sorted(wanted.filter_subjects or [])}")
    for name in ("ack_wait", "max_deliver", "max_ack_pending"):
        got, want = getattr(actual, name), getattr(wanted, name)
        if got is not None and want is not None and abs(float(got) - float(want)) > 1e-6:
            diffs.append(f"{name} {got} != {want}")
    return "; ".join(diffs)


def needed_buckets(service: str) -> tuple[str, ...]:
    """The buckets a service's grant lets it use (waited for at start when managed)."""
    grant = GRANTS.get(service)
    return (*grant.kv_write, *grant.kv_read) if grant else ()


def _not_ready(err: BaseException) -> bool:
    """JetStream is not there yet (no meta leader, stream/consumer/bucket missing), not a bad request."""
    if isinstance(err, NotFoundError | NoRespondersError | NoStreamResponseError | NatsTimeoutError | TimeoutError):
        return True
    return isinstance(err, APIError) and (err.code or 0) >= 500


async def until_ready(service: str, what: str, attempt: Callable[[], Awaitable[R]], give_up_after: float = 0) -> R:
    """Call ``attempt`` until it succeeds while the failure means "not ready yet"."""
    started = last_log = time.monotonic()
    delay = 0.1
    while True:
        try:
            return await attempt()
        except Exception as err:
            if not _not_ready(err):
                raise
            waited = time.monotonic() - started
            if give_up_after and waited >= give_up_after:
                raise InfrastructureNotReady(
                    f"{service}: {what} not ready after {waited:.0f}s (LW_INFRA_WAIT_S; "
                    f"has `loopwarden bootstrap` run?): {describe_nats_error(err)}"
                ) from err
            if time.monotonic() - last_log >= 5.0 or waited == 0:
                log.warning("%s: waiting for %s (%s)", service, what, describe_nats_error(err))
                last_log = time.monotonic()
        await asyncio.sleep(delay)
        delay = min(delay * 2, 2.0)


# What a full stream does (docs/operations.md, "Bounds"). LW_SUBMIT refuses a new submit (its client is told;
# an accepted one is never dropped), LW_FLOW a new ticket (its submit is retried), LW_CMD and LW_EVT a new
# command or event (its service's publish fails and is retried, then dead-lettered: never a run's message
# dropped in silence). LW_DLQ drops its oldest letters: a new failure is kept, and its stream cannot stop a
# service from giving up on a message.
DISCARD_OLD = (S.STREAM_DLQ,)


class BoundTooSmall(RuntimeError):
    """A declared bound is below what the stream or bucket holds now, or does not fit the server's store."""


def stream_config(name: str, settings: Settings) -> StreamConfig:
    if name == S.STREAM_PAYLOADS:
        return payload_stream_config(settings)
    return StreamConfig(
        name=name,
        subjects=S.STREAM_SUBJECTS[name],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        # What a client or an operator sends again (LW_SUBMIT), and a waiting run's ticket (LW_FLOW, published
        # again by a redelivered submit), are kept for a longer window than what only a redelivered handler
        # publishes again: nats-server holds each id of the window in memory.
        duplicate_window=(
            settings.duplicate_window_s if name in (S.STREAM_SUBMIT, S.STREAM_FLOW) else settings.redelivery_dedupe_s
        ),
        # a waiting run's ticket never ages out (its run would wait for nothing)
        max_age=(
            0
            if name == S.STREAM_FLOW
            else settings.evt_max_age_s
            if name == S.STREAM_EVT
            else settings.stream_max_age_s
        ),
        # the door partitioned by tenant (``S.SUBMIT_TRANSFORM``): a submit is stored under its tenant's partition
        subject_transform=(
            SubjectTransform(src=S.SUBMIT_TRANSFORM[0], dest=S.SUBMIT_TRANSFORM[1]) if name == S.STREAM_SUBMIT else None
        ),
        max_bytes=settings.stream_bytes(name) or -1,
        max_msgs=settings.stream_msgs(name) or -1,
        discard=DiscardPolicy.OLD if name in DISCARD_OLD else DiscardPolicy.NEW,
        num_replicas=settings.stream_replicas,
        allow_direct=True,
    )


def _fits(what: str, setting: str, held_bytes: int, held_msgs: int, max_bytes: int, max_msgs: int) -> None:
    """Bootstrap never lowers a bound below what is held: nats-server would drop the oldest messages to fit."""
    if 0 <= max_bytes < held_bytes or 0 <= max_msgs < held_msgs:
        raise BoundTooSmall(
            f"{what} holds {held_bytes} bytes in {held_msgs} messages, more than its bound "
            f"({max_bytes} bytes, {max_msgs} messages; {setting}): raise the bound, or let retention purge first"
        )


NO_PEERS_YET = 10005  # "no suitable peers for placement": a cluster still forming (its routes up, its meta group not)


async def _placed(make: Callable[[], Awaitable[R]], what: str, settings: Settings) -> R:
    """``make()`` (a stream or bucket created with its replicas), asked again while the cluster has too few peers
    for it, for up to ``LW_FAILOVER_RETRY_S``: bootstrap run just after the nodes started would fail otherwise."""
    deadline = time.monotonic() + settings.failover_retry_s
    while True:
        try:
            return await make()
        except APIError as err:
            if err.err_code != NO_PEERS_YET or time.monotonic() >= deadline:
                raise
            log.info("%s: the cluster has too few peers yet (%s); asking again", what, err.description)
            await asyncio.sleep(0.5)


def _no_room(err: APIError, what: str, setting: str) -> BoundTooSmall | APIError:
    if err.err_code == 10047:  # insufficient storage resources: every bound is reserved in the server's store
        return BoundTooSmall(
            f"{what}: its bound does not fit the JetStream storage the server offers (max_file_store): lower "
            f"{setting}, or give the server more ({err.description})"
        )
    return err


async def ensure_streams(js: JetStreamContext, settings: Settings, *, update: bool = False) -> list[str]:
    """Create the streams that are missing. Only with ``update`` (``loopwarden bootstrap``, as
    admin) is an existing stream changed to the declared settings: a service or client that
    connects never rewrites what the operator set (replicas above all). Returns what changed."""
    changed = []
    missing = []
    # Existing streams first: a stream that gave up subjects (LW_CMD's submits and requeues, now LW_SUBMIT's)
    # must have let go of them before the stream that takes them is created.
    for name in S.STREAM_SUBJECTS:
        cfg = stream_config(name, settings)
        try:
            info = await js.stream_info(name)
        except NotFoundError:
            missing.append(cfg)
            continue
        if update and _stream_differs(info.config, cfg):
            setting = _bound_setting(name)
            _fits(
                f"stream {name}",
                setting,
                info.state.bytes,
                info.state.messages,
                cfg.max_bytes or -1,
                cfg.max_msgs or -1,
            )
            try:
                await js.update_stream(cfg)
            except APIError as err:
                raise _no_room(err, f"stream {name}", setting) from err
            changed.append(
                f"updated stream {name} (replicas {info.config.num_replicas} -> {cfg.num_replicas}, "
                f"max_bytes {cfg.max_bytes}, max_msgs {cfg.max_msgs}, discard {_discard(cfg)})"
            )
    for cfg in missing:
        try:
            await _placed(functools.partial(js.add_stream, cfg), f"stream {cfg.name}", settings)
            changed.append(f"created stream {cfg.name} (replicas {cfg.num_replicas}, max_bytes {cfg.max_bytes})")
        except APIError as err:  # another process created it in between
            if "already in use" not in str(err):
                raise _no_room(err, f"stream {cfg.name}", _bound_setting(cfg.name or "")) from err
    return changed


def _bound_setting(stream: str) -> str:
    return "LW_PAYLOAD_MAX_BYTES" if stream == S.STREAM_PAYLOADS else "LW_STREAM_MAX_BYTES / LW_STREAM_MAX_MSGS"


def _discard(cfg: StreamConfig) -> str:
    return str(getattr(cfg.discard, "value", cfg.discard))


def _stream_differs(actual: StreamConfig, wanted: StreamConfig) -> bool:
    return any(
        getattr(actual, f) != getattr(wanted, f)
        for f in (
            "subjects",
            "duplicate_window",
            "max_age",
            "num_replicas",
            "allow_direct",
            "max_bytes",
            "max_msgs",
            "discard",
            "subject_transform",
        )
        if getattr(wanted, f) is not None  # not declared: the server's default stands
    )


# Revisions kept per key. Nothing reads an older revision of a key (every write is a CAS on the current
# one), so one is kept; the tool ledger keeps both of its two writes (created, final) for inspection.
KV_HISTORY: dict[str, int] = {S.KV_TOOL_LEDGER: 2, S.KV_ESCALATIONS: 5}


def kv_history(bucket: str) -> int:
    return KV_HISTORY.get(bucket, 1)


# Buckets whose entries expire (seconds; the others keep theirs). A console revocation need outlive only the
# longest session it revokes (``console_session_s`` is capped at this). A replica's entry in ``lw_replicas``
# lives ``LW_REPLICA_TTL_S`` unless rewritten (``kv_max_age``).
KV_MAX_AGE_S: dict[str, float] = {S.KV_CONSOLE_SESSIONS: 24 * 3600.0}


def kv_max_age(bucket: str, settings: Settings) -> float | None:
    if bucket == S.KV_REPLICAS:
        return settings.replica_ttl_s
    return KV_MAX_AGE_S.get(bucket)


async def ensure_buckets(
    js: JetStreamContext, settings: Settings, buckets: list[str] | None = None, *, update: bool = False
) -> list[str]:
    """Create the buckets that are missing; with ``update`` (bootstrap) set existing ones to the
    declared replica count. Returns what changed."""
    changed = []
    for bucket in buckets or S.ALL_BUCKETS:
        try:
            await js.key_value(bucket)
        except BucketNotFoundError:
            try:
                config = KeyValueConfig(
                    bucket=bucket,
                    history=kv_history(bucket),
                    ttl=kv_max_age(bucket, settings),
                    max_bytes=settings.bucket_bytes(bucket),
                    storage=StorageType.FILE,
                    replicas=settings.kv_replicas,
                    direct=True,
                )
                await _placed(functools.partial(js.create_key_value, config), f"bucket {bucket}", settings)
                changed.append(f"created bucket {bucket} (replicas {settings.kv_replicas})")
            except APIError as err:  # another process created it in between
                if "already in use" not in str(err):
                    raise _no_room(err, f"bucket {bucket}", "LW_BUCKET_MAX_BYTES") from err
            continue
        if update:
            info = await js.stream_info(f"KV_{bucket}")
            changed += await _bound_bucket(js, bucket, settings, info)
            info = await js.stream_info(f"KV_{bucket}")
            if info.config.num_replicas != settings.kv_replicas:
                before = info.config.num_replicas
                await js.update_stream(info.config.evolve(num_replicas=settings.kv_replicas))
                changed.append(f"updated bucket {bucket} (replicas {before} -> {settings.kv_replicas})")
            if info.config.max_msgs_per_subject != kv_history(bucket):
                before = info.config.max_msgs_per_subject
                info = await js.stream_info(f"KV_{bucket}")
                await js.update_stream(info.config.evolve(max_msgs_per_subject=kv_history(bucket)))
                changed.append(f"updated bucket {bucket} (history {before} -> {kv_history(bucket)})")
    return changed


async def _bound_bucket(js: JetStreamContext, bucket: str, settings: Settings, info: Any) -> list[str]:
    """Bootstrap: a bucket's byte bound (and a replica registry's age limit) as declared."""
    max_bytes, max_age = settings.bucket_bytes(bucket), kv_max_age(bucket, settings)
    cfg = info.config
    want_age = max_age if max_age is not None else cfg.max_age
    if cfg.max_bytes == max_bytes and (cfg.max_age or 0) == (want_age or 0):
        return []
    _fits(f"bucket {bucket}", "LW_BUCKET_MAX_BYTES", info.state.bytes, 0, max_bytes, -1)
    try:
        await js.update_stream(cfg.evolve(max_bytes=max_bytes, max_age=want_age))
    except APIError as err:
        raise _no_room(err, f"bucket {bucket}", "LW_BUCKET_MAX_BYTES") from err
    return [f"updated bucket {bucket} (max_bytes {cfg.max_bytes} -> {max_bytes})"]


async def ensure_consumers(js: JetStreamContext, settings: Settings, specs: list[ConsumerSpec]) -> list[str]:
    """Create or update each declared durable consumer (bootstrap). Returns what changed."""
    changed = []
    for spec in specs:
        wanted = consumer_config(spec, settings)
        try:
            info = await js.consumer_info(spec.stream, spec.durable)
        except NotFoundError:
            await js.add_consumer(spec.stream, wanted)
            changed.append(f"created consumer {spec.stream}/{spec.durable}")
            continue
        drift = consumer_drift(info.config, wanted)
        if drift:
            await js.add_consumer(spec.stream, wanted)
            changed.append(f"updated consumer {spec.stream}/{spec.durable} ({drift})")
    return changed
