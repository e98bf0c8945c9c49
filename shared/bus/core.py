"""What every part of the bus stands on: the connection, the settings, riding out a failover,
tracing, and decoding a received body (fetched by reference when it travelled as a claim check)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from faststream.nats import NatsBroker
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.client import JetStreamContext
from nats.js.errors import (
    NoStreamResponseError,
    ServiceUnavailableError,
)
from nats.js.kv import KeyValue
from opentelemetry import context as otel_context
from opentelemetry import propagate
from opentelemetry.trace import SpanKind, Tracer
from pydantic import BaseModel

from shared import subjects as S
from shared.bus.errors import Undecodable, describe_nats_error
from shared.bus.infra import until_ready
from shared.bus.wire import LW_RUN_ID_ATTR, RUN_ID_HEADER, decode
from shared.payloads import PayloadError, PayloadStore, PayloadTooLarge
from shared.settings import Settings

if TYPE_CHECKING:
    from shared.bus.infra import ConsumerSpec
    from shared.metrics import BusMetrics

log = logging.getLogger("loopwarden.bus")
M = TypeVar("M", bound=BaseModel)
R = TypeVar("R")


class BusBase:
    """The state the parts of ``Bus`` share (set by ``Bus.__post_init__``) and the helpers they all use.
    What only one part uses is that part's: declared on it and set by its ``_init_state``."""

    settings: Settings
    service: str
    broker: NatsBroker
    payloads: PayloadStore
    on_stop: list[Callable[[], Awaitable[None]]]
    _consumers: list[ConsumerSpec]
    _kv: dict[str, KeyValue]
    _connected: bool
    _failures: Any
    bus_metrics: BusMetrics | None
    _tracer: Tracer | None
    _requeue_to: dict[str, str]
    _stopping: bool
    closed_for_good: asyncio.Event
    _subs: list[Subscription]
    _background: set[asyncio.Task[Any]]
    _started: bool
    _js: JetStreamContext | None

    def _init_state(self) -> None:
        """Set each part's own state: a part that has some overrides this, calling ``super()`` first; the bus
        calls it once, from ``__post_init__``, after the shared state above."""

    # --- lifecycle ---------------------------------------------------------------------------
    @property
    def inbox_prefix(self) -> str:
        return S.inbox_prefix(self.service, self.settings.tenant)  # a person's under its role (tenant, operator)

    @property
    def nc(self) -> NatsClient:
        return self.broker.connection

    @property
    def js(self) -> JetStreamContext:
        if self._js is None:
            self._js = self.broker.connection.jetstream()
        return self._js

    async def through_failover(
        self,
        what: str,
        call: Callable[[], Awaitable[R]],
        *,
        repeatable: bool = False,
        resolve: Callable[[], Awaitable[R | None]] | None = None,
    ) -> R:
        """Run a JetStream request, riding out a stream electing a new leader (a node died).

        "No responders" and "JetStream system temporarily unavailable" (503, the meta leader is
        being elected) mean nothing was stored: it is sent again. A timeout is ambiguous: it
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
            except (NoStreamResponseError, NoRespondersError, ServiceUnavailableError) as err:
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

    def _spawn(self, coro: Coroutine[Any, Any, Any], name: str | None = None) -> None:
        task = asyncio.create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _decode(self, model: type[M], msg: Msg) -> M:
        """The body as ``model``, fetched from the payload store first when it travelled by
        reference; ``Undecodable`` names why it cannot be had."""
        try:
            data = await self.payloads.inflate(
                self.nc, msg.data, msg.headers, max_bytes=self.settings.body_limit(model.__name__)
            )
        except PayloadTooLarge as err:  # refused before it is fetched: the service never holds it
            raise Undecodable(f"does not match contract {model.__name__}: {err}") from None
        except PayloadError as err:
            raise Undecodable(f"payload reference cannot be resolved: {err}") from None
        return decode(model, data)

    # --- tracing (only when spans are exported) ------------------------------------------------
    def _extract(self, headers: dict[str, str] | None) -> otel_context.Context | None:
        return propagate.extract(headers or {})

    @contextlib.contextmanager
    def _span(
        self, name: str, kind: SpanKind, ctx: otel_context.Context | None, headers: dict[str, str] | None
    ) -> Iterator[None]:
        if self._tracer is None:
            yield
            return
        attrs: dict[str, str] = {"messaging.system": "nats", "messaging.destination.name": name.rsplit(" ", 1)[0]}
        run_id = (headers or {}).get(RUN_ID_HEADER)
        if run_id:
            attrs[LW_RUN_ID_ATTR] = run_id
        with self._tracer.start_as_current_span(name, context=ctx, kind=kind, attributes=attrs):
            yield
