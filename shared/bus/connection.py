"""The one bus helper: broker, streams, consumers, buckets, publishing, dead letters.

Handlers stay thin: ``Bus.consumer`` decodes the message into its contract, dead-letters
what does not fit (with the reason), heartbeats every message it holds, acks only after the
handler returned (its effects are durable by then), and dead-letters a message that keeps
failing - or that never completes because its handler kills the process - instead of letting
it block the consumer or vanish.

Concurrency: the bus drives each durable pull consumer on nats-py itself (FastStream 0.7.8's
``max_workers`` pull subscriber fetches with ``fetch(batch)``, whose lingering request holds a
first message until the batch fills or the request expires, and passes each message through
its dependency injection with a thread hop). Pull requests ask for as many messages as there
are free slots (``LW_MAX_IN_FLIGHT`` per consumer); each message runs as its own task, under a
lock per run id (the ``Lw-Run-Id`` header) so one run's messages are handled one after another
in a replica while different runs overlap. On stop, nothing new is taken, in-flight handlers get
a grace period and what does not finish is handed back (nak) at once."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from faststream.nats import NatsBroker, NatsUserPassword
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Tracer

from shared.bus.infra import ConsumerSpec, ensure_streams, needed_buckets
from shared.bus.requests import Requests, _Responder
from shared.bus.requeue import Requeueing
from shared.metrics import FAILURES, BusMetrics
from shared.payloads import PayloadStore
from shared.permissions import streams_seen
from shared.settings import Settings

log = logging.getLogger("loopwarden.bus")


@dataclass(eq=False)  # one bus is one connection: compared (and hashed) by identity
class Bus(Requeueing, Requests):
    settings: Settings
    service: str
    tracer_provider: TracerProvider | None = None
    meter_provider: MeterProvider | None = None
    broker: NatsBroker = field(init=False)
    _consumers: list[ConsumerSpec] = field(default_factory=list)
    _kv: dict[str, KeyValue] = field(default_factory=dict)
    _connected: bool = False
    on_stop: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    payloads: PayloadStore = field(init=False)  # claim check: large bodies by reference

    def __post_init__(self) -> None:
        self.payloads = PayloadStore(self.settings, self.service)  # bodies stored under this user's name
        self._failures = (
            self.meter_provider.get_meter("loopwarden.bus").create_counter(
                FAILURES, description="failure events by type and tool (every service, one metric)"
            )
            if self.meter_provider
            else None
        )
        # redeliveries and dead letters (docs/observability.md)
        self.bus_metrics = BusMetrics(self.meter_provider.get_meter("loopwarden.bus")) if self.meter_provider else None
        self._tracer: Tracer | None = (
            self.tracer_provider.get_tracer("loopwarden.bus") if self.tracer_provider is not None else None
        )
        self._requeue_to: dict[str, str] = {}  # durable -> where its dead letters are handed back
        self._stopping = False  # set by ``stop``: a handler waiting for a dependency hands its message back
        # Set when the connection is closed for good while this process did not ask for it (nats-server
        # closes a connection for a protocol error, and nats-py does not reconnect then): ``serve`` exits
        # non-zero so a supervisor restarts the service instead of leaving it up and off the bus.
        self.closed_for_good = asyncio.Event()
        self._subs: list[Subscription] = []
        self._background: set[asyncio.Task[Any]] = set()
        self._started = False
        self._js: JetStreamContext | None = None
        self._init_state()  # each part's own (``_pulls``, ``_responders``, ``_replies``, ...)
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
            log_level=logging.DEBUG,
            max_reconnect_attempts=-1,
            graceful_timeout=max(10.0, s.ack_wait_s),
            disconnected_cb=self._on_disconnected,
            reconnected_cb=self._on_reconnected,
            closed_cb=self._on_closed,
        )

    async def _on_disconnected(self) -> None:
        closed = False
        with contextlib.suppress(Exception):
            closed = self.broker.connection.is_closed  # our own close(), not a lost server
        if not closed:
            log.warning("%s: disconnected from NATS; reconnecting", self.service)

    async def _on_closed(self) -> None:
        err = None
        with contextlib.suppress(Exception):
            err = self.broker.connection.last_error
        # Closed by us (``stop``, ``broker.stop``): no error. A permissions violation is an error nats-py
        # remembers without closing, so it does not count either.
        if self._stopping or err is None or "permissions violation" in str(err).lower():
            return
        log.error("%s: the NATS connection is closed for good (%r)", self.service, err)
        self.closed_for_good.set()

    async def _on_reconnected(self) -> None:
        from shared.urls import redact_url  # a password in LW_NATS_URL is never logged

        url = ""
        with contextlib.suppress(Exception):
            url = redact_url(str(getattr(self.broker.connection.connected_url, "netloc", "")))
        log.warning("%s: reconnected to NATS %s", self.service, url)

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
            # a tenant-bound client: the one it submits to
            for stream in streams_seen(self.service, self.settings.tenant):
                await self.until_ready(f"stream {stream}", functools.partial(self.js.stream_info, stream))
            for bucket in needed_buckets(self.service):
                self._kv[bucket] = await self.until_ready(
                    f"bucket {bucket}", functools.partial(self.js.key_value, bucket)
                )
        for spec in self._consumers:
            await self._reconcile_consumer(spec)
        self._connected = True

    async def start(self) -> None:
        """Start consuming: every registered durable and request/reply subject."""
        if not self._connected:
            await self.connect()
        for r in self._responders:

            async def on_request(msg: Msg, r: _Responder = r) -> None:
                self._spawn(self._answer(r, msg), name=f"answer {msg.subject}")

            self._subs.append(await self.nc.subscribe(r.subject, queue=self.service, cb=on_request))
        for pull in self._pulls:
            await pull.start(self.nc, self.js)
        self._spawn(self._heartbeats())
        self._started = True

    async def stop(self) -> None:
        """Finish in-flight handlers (handing back what does not finish in time), close the
        connection (or just close if the server is already gone), then run the ``on_stop``
        hooks (e.g. closing MCP sessions), each bounded."""
        self._stopping = True
        try:
            connected = self.broker.connection.is_connected
        except Exception:  # never connected
            connected = False
        try:
            for sub in self._subs:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
            grace = max(1.0, min(self.settings.ack_wait_s, 10.0)) if connected else 0.5
            await asyncio.gather(*(pull.stop(grace) for pull in self._pulls), return_exceptions=True)
            answering = [t for t in self._background if t.get_name().startswith("answer")]
            if answering:  # requests being served get the same grace
                await asyncio.wait(answering, timeout=grace)
            for task in list(self._background):
                task.cancel()
            if connected:
                await self.broker.stop()
            else:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(2):
                        await self.broker.stop()
            self._replies.close()
        finally:
            for hook in self.on_stop:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(5):
                        await hook()
