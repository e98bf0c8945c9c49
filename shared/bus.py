"""The one bus helper: broker, streams, consumers, buckets, publishing, dead letters.

Handlers stay thin: ``Bus.consumer`` decodes the message into its contract, dead-letters
what does not fit (with the reason), heartbeats long handlers, acks only after the
handler returned (its effects are durable by then), and dead-letters a message that keeps
failing instead of letting it block the consumer or vanish.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from faststream import AckPolicy
from faststream.nats import JStream, NatsBroker, NatsRouter, NatsUserPassword, PullSub
from faststream.nats.annotations import NatsMessage
from faststream.nats.opentelemetry import NatsTelemetryMiddleware
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import (
    AckPolicy as JsAckPolicy,
)
from nats.js.api import (
    ConsumerConfig,
    DeliverPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.client import JetStreamContext
from nats.js.errors import (
    APIError,
    BucketNotFoundError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NoStreamResponseError,
    NotFoundError,
)
from nats.js.kv import KeyValue
from opentelemetry import context as otel_context
from opentelemetry import propagate
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from pydantic import BaseModel, ValidationError

from shared import subjects as S
from shared.messages import DeadLetter
from shared.settings import Settings

log = logging.getLogger("loopwarden.bus")
M = TypeVar("M", bound=BaseModel)
R = TypeVar("R")
Handler = Callable[[M], Awaitable[None]]

RUN_ID_HEADER = "Lw-Run-Id"
MSG_ID_HEADER = "Nats-Msg-Id"


class TryLater(Exception):
    """Raised by a handler whose dependency is not ready: redeliver after ``delay``."""

    def __init__(self, reason: str, delay: float = 0.5) -> None:
        super().__init__(reason)
        self.delay = delay


class CasConflict(Exception):
    """The key changed since it was read; reload and apply again."""


class InfrastructureNotReady(RuntimeError):
    """A stream, bucket or consumer this process needs is still missing after ``LW_INFRA_WAIT_S``."""


@dataclass(frozen=True)
class ConsumerSpec:
    stream: str
    durable: str
    filter_subjects: tuple[str, ...]


@dataclass
class Bus:
    settings: Settings
    service: str
    tracer_provider: TracerProvider | None = None
    meter_provider: MeterProvider | None = None
    broker: NatsBroker = field(init=False)
    _consumers: list[ConsumerSpec] = field(default_factory=list)
    _kv: dict[str, KeyValue] = field(default_factory=dict)
    _connected: bool = False
    on_stop: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._failures = (
            self.meter_provider.get_meter("loopwarden.bus").create_counter(
                "loopwarden.failures", description="failure events by type and tool (every service, one metric)"
            )
            if self.meter_provider
            else None
        )
        middlewares = []
        if self.tracer_provider is not None:
            middlewares.append(NatsTelemetryMiddleware(tracer_provider=self.tracer_provider))
        s = self.settings
        security = None
        if s.nats_user:
            password = s.nats_password.get_secret_value() if s.nats_password else ""
            security = NatsUserPassword(username=s.nats_user, password=password)
        self.broker = NatsBroker(
            [u.strip() for u in s.nats_url.split(",")],
            name=f"loopwarden-{self.service}",
            security=security,
            inbox_prefix=self.inbox_prefix,  # one inbox namespace per service: replies stay private
            middlewares=middlewares,
            log_level=logging.DEBUG,  # per-message "Received/Processed" lines only at DEBUG
            max_reconnect_attempts=-1,
            graceful_timeout=max(10.0, s.ack_wait_s),
            disconnected_cb=self._on_disconnected,
            reconnected_cb=self._on_reconnected,
        )

    async def _on_disconnected(self) -> None:
        closed = False
        with contextlib.suppress(Exception):
            closed = self.broker.connection.is_closed  # our own close(), not a lost server
        if not closed:
            log.warning("%s: disconnected from NATS; reconnecting", self.service)

    async def _on_reconnected(self) -> None:
        url = ""
        with contextlib.suppress(Exception):
            url = str(getattr(self.broker.connection.connected_url, "netloc", ""))
        log.warning("%s: reconnected to NATS %s", self.service, url)

    # --- lifecycle ---------------------------------------------------------------------------
    @property
    def inbox_prefix(self) -> str:
        return inbox_prefix(self.service)

    @property
    def js(self) -> JetStreamContext:
        return self.broker.connection.jetstream()

    async def connect(self) -> None:
        """Connect, then make sure the streams, buckets and consumers this process uses exist.

        Unmanaged (``LW_MANAGE_STREAMS=true``, the local default): what is missing is created,
        nothing that exists is changed (a client never drops a 3-replica stream to 1).
        Managed (``false``): ``loopwarden bootstrap`` created everything; this process creates
        and changes nothing and waits until all of it exists (a fresh cluster, bootstrap not
        run yet) instead of exiting."""
        await self.broker.connect()
        if self.settings.manage_streams:
            await self.until_ready("streams", lambda: ensure_streams(self.js, self.settings))
        else:
            for stream in S.STREAM_SUBJECTS:
                await self.until_ready(f"stream {stream}", functools.partial(self.js.stream_info, stream))
            for bucket in needed_buckets(self.service):
                self._kv[bucket] = await self.until_ready(
                    f"bucket {bucket}", functools.partial(self.js.key_value, bucket)
                )
        for spec in self._consumers:
            await self._reconcile_consumer(spec)
        self._connected = True

    async def through_failover(
        self,
        what: str,
        call: Callable[[], Awaitable[R]],
        *,
        repeatable: bool = False,
        resolve: Callable[[], Awaitable[R | None]] | None = None,
    ) -> R:
        """Run a JetStream request, riding out a stream electing a new leader (a node died).

        "No responders" means nothing was stored: it is sent again. A timeout is ambiguous: it
        is sent again when repeating is harmless (``repeatable``: a read, a plain put, a publish
        de-duplicated by its id); a compare-and-swap is sent again unless ``resolve`` finds it
        was applied (a repeat of an applied one fails as a conflict, as with any other writer).
        So a handler keeps what it knows in memory (a tool that already ran) instead of failing
        and leaving a redelivery to guess. Gives up after ``LW_FAILOVER_RETRY_S``."""
        deadline = time.monotonic() + self.settings.failover_retry_s
        delay = 0.1
        while True:
            try:
                return await call()
            except (NoStreamResponseError, NoRespondersError) as err:
                failure: Exception = err  # nothing was stored
            except (NatsTimeoutError, TimeoutError) as err:
                failure = err
                if resolve is not None:  # a compare-and-swap: ours if the stored value is ours
                    with contextlib.suppress(NatsTimeoutError, TimeoutError, NoStreamResponseError, NoRespondersError):
                        applied = await resolve()
                        if applied is not None:
                            return applied
                elif not repeatable:
                    raise
            if time.monotonic() > deadline:
                raise failure
            log.warning("%s: %s: JetStream unavailable (%s), again", self.service, what, describe_nats_error(failure))
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def until_ready(self, what: str, attempt: Callable[[], Awaitable[R]]) -> R:
        """Retry ``attempt`` while JetStream is not ready or what it needs does not exist yet
        (logged every few seconds, naming what is missing); other errors are raised."""
        return await until_ready(self.service, what, attempt, self.settings.infra_wait_s)

    @property
    def consumer_specs(self) -> list[ConsumerSpec]:
        """The durable consumers this process declared (what bootstrap creates for it)."""
        return list(self._consumers)

    async def reconcile_consumers(self) -> None:
        for spec in self._consumers:
            await self._reconcile_consumer(spec)

    async def start(self) -> None:
        if not self._connected:
            await self.connect()
        await self.broker.start()

    async def stop(self) -> None:
        """Drain in-flight handlers (or just close if the server is already gone), then run
        the ``on_stop`` hooks (e.g. closing MCP sessions), each bounded."""
        try:
            connected = self.broker.connection.is_connected
        except Exception:  # never connected
            connected = False
        try:
            if connected:
                await self.broker.stop()
            else:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(2):
                        await self.broker.stop()
        finally:
            for hook in self.on_stop:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(5):
                        await hook()

    async def _reconcile_consumer(self, spec: ConsumerSpec) -> None:
        if not self.settings.manage_streams:
            # Managed: bootstrap created it (the service's user may not change it); wait for it.
            info = await self.until_ready(
                f"consumer {spec.stream}/{spec.durable}", lambda: self.js.consumer_info(spec.stream, spec.durable)
            )
            drift = consumer_drift(info.config, consumer_config(spec, self.settings))
            if drift:
                log.warning(
                    "%s: consumer %s differs from this service's settings (%s); run `loopwarden bootstrap`",
                    self.service,
                    spec.durable,
                    drift,
                )
            return
        # JetStream's create request without an action is create-or-update, so a changed
        # ack_wait / max_deliver in settings takes effect (faststream alone would keep the
        # config the durable was first created with).
        cfg = consumer_config(spec, self.settings)
        await self.until_ready(f"consumer {spec.stream}/{spec.durable}", lambda: self.js.add_consumer(spec.stream, cfg))

    # --- consuming ---------------------------------------------------------------------------
    def consumer(
        self,
        router: NatsRouter,
        *,
        durable: str,
        filter_subjects: list[str],
        model: type[M],
        stream: str = S.STREAM_CMD,
    ) -> Callable[[Handler[M]], Handler[M]]:
        """Register ``handler(payload)`` on a durable JetStream pull consumer."""
        spec = ConsumerSpec(stream, durable, tuple(filter_subjects))
        self._consumers.append(spec)

        def register(handler: Handler[M]) -> Handler[M]:
            async def on_message(msg: NatsMessage) -> None:
                await self._deliver(msg, model, handler)

            on_message.__name__ = handler.__name__
            router.subscriber(
                filter_subjects[0] if len(filter_subjects) == 1 else f"{S.P}.>",
                stream=JStream(stream, declare=False),
                durable=durable,
                pull_sub=PullSub(batch_size=1, timeout=1.0),
                ack_policy=AckPolicy.MANUAL,
                inbox_prefix=f"{self.inbox_prefix}.".encode(),
                title=durable,
            )(on_message)
            return handler

        return register

    def responder(
        self,
        router: NatsRouter,
        *,
        subject: str,
        model: type[M],
        reply: Callable[[str], BaseModel],
    ) -> Callable[[Callable[[M], Awaitable[BaseModel]]], Callable[[M], Awaitable[BaseModel]]]:
        """Register a queue-grouped request/reply handler; a malformed request is dead-lettered
        and answered with ``reply(reason)`` instead of hanging the caller."""

        def register(handler: Callable[[M], Awaitable[BaseModel]]) -> Callable[[M], Awaitable[BaseModel]]:
            async def on_request(msg: NatsMessage) -> bytes:
                raw = msg.raw_message
                try:
                    payload = model.model_validate_json(raw.data)
                except ValidationError as err:
                    reason = f"does not match contract {model.__name__}: {describe(err)}"
                    await self.dead_letter(raw, reason, 1)
                    return reply(reason).model_dump_json().encode()
                result = await handler(payload)
                return result.model_dump_json(by_alias=True).encode()

            on_request.__name__ = handler.__name__
            router.subscriber(subject, queue=self.service, title=f"{self.service}:{subject}")(on_request)
            return handler

        return register

    async def _deliver(self, msg: Any, model: type[M], handler: Handler[M]) -> None:
        raw = msg.raw_message
        deliveries = raw.metadata.num_delivered if raw.metadata else 1
        try:
            payload = model.model_validate_json(raw.data)
        except ValidationError as err:
            await self.dead_letter(raw, f"does not match contract {model.__name__}: {describe(err)}", deliveries)
            await msg.ack()
            return
        try:
            async with self.heartbeat(msg):
                await handler(payload)
        except TryLater as later:
            log.info("%s: retry later (%s)", self.service, later)
            await msg.nack(delay=later.delay)
            return
        except Exception as err:
            if deliveries >= self.settings.max_deliver:
                log.exception("%s: giving up on %s after %d deliveries", self.service, raw.subject, deliveries)
                await self.dead_letter(raw, f"handler failed {deliveries} times: {err!r}", deliveries)
                await msg.ack()
                return
            log.warning("%s: handler failed on %s (delivery %d): %r", self.service, raw.subject, deliveries, err)
            await msg.nack(delay=self.settings.redeliver_delay_s * 2 ** (deliveries - 1))
            return
        await msg.ack()

    @contextlib.asynccontextmanager
    async def heartbeat(self, msg: Any) -> AsyncIterator[None]:
        """Tell JetStream a long handler (model call, slow tool) is still working on ``msg``."""
        interval = max(0.2, self.settings.ack_wait_s / 3)

        async def beat() -> None:
            while True:
                await asyncio.sleep(interval)
                with contextlib.suppress(Exception):
                    await msg.in_progress()

        task = asyncio.create_task(beat())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def dead_letter(self, raw: Any, reason: str, deliveries: int) -> None:
        body = raw.data.decode("utf-8", errors="replace")
        letter = DeadLetter(
            service=self.service,
            subject=raw.subject,
            reason=reason,
            body=body,
            headers={k: str(v) for k, v in (raw.headers or {}).items()},
            deliveries=deliveries,
        )
        seq = raw.metadata.sequence.stream if raw.metadata else 0
        await self.publish(S.dead_letter(self.service), letter, msg_id=f"dlq-{self.service}-{raw.subject}-{seq}")
        log.error("%s: dead-lettered %s: %s", self.service, raw.subject, reason)

    # --- publishing --------------------------------------------------------------------------
    async def publish(
        self,
        subject: str,
        payload: BaseModel | bytes,
        *,
        msg_id: str | None = None,
        run_id: str | None = None,
        traceparent: str | None = None,
    ) -> None:
        """Publish to JetStream; ``msg_id`` makes a re-publish after a crash a no-op."""
        headers = {"content-type": "application/json"}
        if msg_id:
            headers[MSG_ID_HEADER] = msg_id
        run_id = run_id or getattr(payload, "run_id", None)
        if run_id:
            headers[RUN_ID_HEADER] = run_id
        stream = stream_for(subject)
        body = payload if isinstance(payload, bytes) else payload.model_dump_json(by_alias=True).encode()
        token = None
        if traceparent:  # continue a stored trace (e.g. a human resolving an escalation)
            token = otel_context.attach(propagate.extract({"traceparent": traceparent}))
        try:
            ack = await self.through_failover(
                f"publish {subject}",
                lambda: self.broker.publish(body, subject, headers=headers, stream=stream, correlation_id=run_id),
                repeatable=msg_id is not None,  # a repeat is de-duplicated by its message id
            )
            if (
                self._failures is not None
                and subject.startswith(S.FAILURE_PREFIX + ".")
                and not getattr(ack, "duplicate", False)
            ):
                _, ftype, tool = subject.rsplit(".", 2)
                self._failures.add(1, {"failure.type": ftype, "tool": tool})
        finally:
            if token is not None:
                otel_context.detach(token)

    async def request(self, subject: str, payload: BaseModel, reply: type[M]) -> M:
        """Core-NATS request/reply (queue-grouped service), decoded into ``reply``."""
        resp = await self.broker.request(
            payload.model_dump_json(by_alias=True).encode(),
            subject,
            timeout=self.settings.rpc_timeout_s,
            headers={"content-type": "application/json"},
        )
        return reply.model_validate_json(resp.body)

    # --- key-value ---------------------------------------------------------------------------
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
            entry = await self.through_failover(f"read {bucket}/{key}", lambda: kv.get(key), repeatable=True)
        except KeyNotFoundError:
            return None, 0
        if entry.value is None or entry.operation in ("DEL", "PURGE"):
            return None, entry.revision or 0
        return model.model_validate_json(entry.value), entry.revision or 0

    async def update(
        self,
        bucket: str,
        key: str,
        model: type[M],
        change: Callable[[M | None], tuple[M, R] | Unchanged[R]],
        attempts: int = 20,
    ) -> R:
        """Read-modify-write under compare-and-swap: ``change`` gets the current value (None if
        absent) and returns the new value with a result, or ``Unchanged(result)``. A conflict
        (another writer got there first) re-reads and calls ``change`` again."""
        for _ in range(attempts):
            current, revision = await self.kv_get(bucket, key, model)
            outcome = change(current)
            if isinstance(outcome, Unchanged):
                return outcome.result
            new, result = outcome
            try:
                await self.kv_put(bucket, key, new, revision=revision)
            except CasConflict:
                continue
            return result
        raise CasConflict(f"{bucket}/{key}: still contended after {attempts} attempts")

    async def kv_put(self, bucket: str, key: str, value: BaseModel, *, revision: int | None = None) -> int:
        """Write ``value``; with ``revision`` it is a compare-and-swap (0 = must not exist yet)."""
        kv = await self.kv(bucket)
        data = value.model_dump_json(by_alias=True).encode()
        try:
            if revision is None:
                return await self.through_failover(f"write {bucket}/{key}", lambda: kv.put(key, data), repeatable=True)

            async def landed() -> int | None:  # a timed-out compare-and-swap may have been applied
                with contextlib.suppress(KeyNotFoundError):
                    entry = await kv.get(key)
                    if entry.value == data and (entry.revision or 0) > revision:
                        return entry.revision
                return None

            if revision == 0:
                return await self.through_failover(
                    f"write {bucket}/{key}", lambda: kv.create(key, data), resolve=landed
                )
            return await self.through_failover(
                f"write {bucket}/{key}", lambda: kv.update(key, data, last=revision), resolve=landed
            )
        except KeyWrongLastSequenceError as err:
            raise CasConflict(f"{bucket}/{key} changed since revision {revision}") from err
        except Exception as err:  # create() on an existing key
            if "key exists" in str(err).lower() or "wrong last sequence" in str(err).lower():
                raise CasConflict(f"{bucket}/{key} already exists") from err
            raise


class Unchanged(Generic[R]):
    """Returned by an ``update`` change function that has nothing to write."""

    def __init__(self, result: R) -> None:
        self.result = result


def inbox_prefix(service: str) -> str:
    return f"_INBOX_{S.token(service)}"


def stream_for(subject: str) -> str | None:
    for stream, patterns in S.STREAM_SUBJECTS.items():
        if any(subject.startswith(p[:-1]) for p in patterns):
            return stream
    return None


def consumer_config(spec: ConsumerSpec, settings: Settings) -> ConsumerConfig:
    """The one consumer config: what ``loopwarden bootstrap`` creates and a service expects."""
    return ConsumerConfig(
        durable_name=spec.durable,
        ack_policy=JsAckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.ALL,
        ack_wait=settings.ack_wait_s,
        max_deliver=settings.max_deliver + 2,  # we dead-letter at max_deliver ourselves
        filter_subjects=list(spec.filter_subjects),
        max_ack_pending=1000,
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
    from shared.permissions import GRANTS  # permissions imports this module

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


def describe_nats_error(err: BaseException) -> str:
    if isinstance(err, APIError):
        return f"{err.description or type(err).__name__} (code {err.code}, err_code {err.err_code})"
    return repr(err) if str(err) else type(err).__name__


def stream_config(name: str, settings: Settings) -> StreamConfig:
    return StreamConfig(
        name=name,
        subjects=S.STREAM_SUBJECTS[name],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        duplicate_window=settings.duplicate_window_s,
        max_age=settings.stream_max_age_s,
        num_replicas=settings.stream_replicas,
        allow_direct=True,
    )


async def ensure_streams(js: JetStreamContext, settings: Settings, *, update: bool = False) -> list[str]:
    """Create the streams that are missing. Only with ``update`` (``loopwarden bootstrap``, as
    admin) is an existing stream changed to the declared settings: a service or client that
    connects never rewrites what the operator set (replicas above all). Returns what changed."""
    changed = []
    for name in S.STREAM_SUBJECTS:
        cfg = stream_config(name, settings)
        try:
            info = await js.stream_info(name)
        except NotFoundError:
            try:
                await js.add_stream(cfg)
                changed.append(f"created stream {name} (replicas {cfg.num_replicas})")
            except APIError as err:  # another process created it in between
                if "already in use" not in str(err):
                    raise
            continue
        if update and _stream_differs(info.config, cfg):
            await js.update_stream(cfg)
            changed.append(f"updated stream {name} (replicas {info.config.num_replicas} -> {cfg.num_replicas})")
    return changed


def _stream_differs(actual: StreamConfig, wanted: StreamConfig) -> bool:
    return any(
        getattr(actual, f) != getattr(wanted, f)
        for f in ("subjects", "duplicate_window", "max_age", "num_replicas", "allow_direct")
    )


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
                await js.create_key_value(
                    KeyValueConfig(
                        bucket=bucket, history=5, storage=StorageType.FILE, replicas=settings.kv_replicas, direct=True
                    )
                )
                changed.append(f"created bucket {bucket} (replicas {settings.kv_replicas})")
            except APIError as err:  # another process created it in between
                if "already in use" not in str(err):
                    raise
            continue
        if update:
            info = await js.stream_info(f"KV_{bucket}")
            if info.config.num_replicas != settings.kv_replicas:
                before = info.config.num_replicas
                await js.update_stream(info.config.evolve(num_replicas=settings.kv_replicas))
                changed.append(f"updated bucket {bucket} (replicas {before} -> {settings.kv_replicas})")
    return changed


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


def describe(err: ValidationError) -> str:
    """A pydantic error in one line naming each bad field by path."""
    parts = []
    for e in err.errors()[:8]:
        loc = ".".join(str(p) for p in e["loc"]) or "(message)"
        parts.append(f"{loc}: {e['msg']}")
    more = len(err.errors()) - 8
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"), default=str)
