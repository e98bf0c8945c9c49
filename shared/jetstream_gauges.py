"""The fleet's JetStream figures, from the service that knows each: backlog and pending acks of every
durable consumer this process reads through, and the store of the streams it reports.

A background task asks the server (``CONSUMER.INFO`` of its own durables, ``STREAM.INFO`` of its streams,
rights every service's grant has) every ``LW_METRICS_POLL_S`` seconds and keeps the answers; the gauges
read them at collection, so a scrape, or a storm of them, costs no request to the server. A consumer or
stream whose info cannot be read is left out (not reported as zero) until it can be again, and
``loopwarden.metrics.poll_errors`` counts the failure (one not created yet, a bucket made on first use,
is only left out).

Which streams a service reports: the planner every stream (``LW_CMD``, ``LW_SUBMIT``, ``LW_EVT``,
``LW_DLQ``, ``LW_PAYLOADS``), and every service the buckets it writes (``KV_<bucket>``); replicas of a
service report the same figures (a query takes ``max by (stream, durable)``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import Any

from nats.js.errors import NotFoundError
from opentelemetry.metrics import Meter

from shared import metrics as M
from shared import subjects as S
from shared.bus.infra import ConsumerSpec
from shared.permissions import GRANTS

log = logging.getLogger("loopwarden.metrics")
STREAM_REPORTER = "planner"


def reported_streams(service: str) -> tuple[str, ...]:
    """The streams ``service`` reports the store of (see the module's docstring)."""
    grant = GRANTS.get(service)
    buckets = tuple(f"KV_{b}" for b in grant.kv_write) if grant else ()
    return (*S.STREAM_SUBJECTS, *buckets) if service == STREAM_REPORTER else buckets


class JetStreamGauges:
    """Polls JetStream in the background; ``loopwarden.consumer.*`` and ``loopwarden.store.*`` read the answers."""

    def __init__(
        self,
        js: Callable[[], Any],
        consumers: Callable[[], Iterable[ConsumerSpec]],
        streams: tuple[str, ...],
        meter: Meter,
        interval_s: float,
    ) -> None:
        self.js, self.consumers, self.streams, self.interval_s = js, consumers, streams, interval_s
        self.pending = M.Gauges(meter, M.CONSUMER_PENDING, description="messages of the consumer not delivered yet")
        self.ack_pending = M.Gauges(
            meter, M.CONSUMER_ACK_PENDING, description="messages delivered to a replica and not acknowledged yet"
        )
        self.redelivered = M.Gauges(
            meter, M.CONSUMER_REDELIVERED, description="unacknowledged messages delivered more than once"
        )
        self.store_bytes = M.Gauges(meter, M.STORE_BYTES, unit="By", description="bytes the stream stores")
        self.store_messages = M.Gauges(meter, M.STORE_MESSAGES, description="messages the stream stores")
        self.store_max = M.Gauges(meter, M.STORE_MAX_BYTES, unit="By", description="the stream's byte bound")
        self.errors = meter.create_counter(M.POLL_ERRORS, description="JetStream info requests that failed")
        for what in ("consumer", "stream"):  # at 0 from the start: the first failure is an increase
            self.errors.add(0, {"what": what})
        self._task: asyncio.Task[None] | None = None
        self._failing: set[str] = set()  # what failed last time (logged once until it answers again)

    async def poll(self) -> None:
        """Ask once for every consumer's and stream's info, concurrently, and keep what answered."""
        specs = list(self.consumers())
        consumer_infos = await asyncio.gather(
            *(
                self._ask(f"consumer {c.stream}/{c.durable}", self.js().consumer_info, c.stream, c.durable)
                for c in specs
            )
        )
        stream_infos = await asyncio.gather(*(self._ask(f"stream {s}", self.js().stream_info, s) for s in self.streams))
        rows = [
            ({"stream": c.stream, "durable": c.durable}, info) for c, info in zip(specs, consumer_infos, strict=True)
        ]
        known = [(attrs, info) for attrs, info in rows if info is not None]
        self.pending.replace((a, float(i.num_pending or 0)) for a, i in known)
        self.ack_pending.replace((a, float(i.num_ack_pending or 0)) for a, i in known)
        self.redelivered.replace((a, float(i.num_redelivered or 0)) for a, i in known)
        streams = [
            ({"stream": s}, info) for s, info in zip(self.streams, stream_infos, strict=True) if info is not None
        ]
        self.store_bytes.replace((a, float(i.state.bytes)) for a, i in streams)
        self.store_messages.replace((a, float(i.state.messages)) for a, i in streams)
        self.store_max.replace(
            (a, float(i.config.max_bytes)) for a, i in streams if i.config.max_bytes and i.config.max_bytes > 0
        )

    async def _ask(self, what: str, request: Callable[..., Any], *args: str) -> Any:
        try:
            info = await request(*args)
        except NotFoundError:  # not created yet (a bucket made on first use): nothing to report, nothing wrong
            return None
        except Exception as err:
            self.errors.add(1, {"what": what.split(" ", 1)[0]})
            if what not in self._failing:
                self._failing.add(what)
                log.warning("metrics: no info of %s (%r); left out until it answers", what, err)
            return None
        self._failing.discard(what)
        return info

    async def run(self) -> None:
        while True:
            try:
                await self.poll()
            except Exception:  # a bad moment (a reconnect) must not end the poll
                log.exception("metrics: the JetStream poll failed")
            await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name="jetstream gauges")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
