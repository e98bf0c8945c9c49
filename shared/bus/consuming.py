"""Consuming: registering a handler on a durable, delivering a message into it (try-later in
place, nak with backoff, dead letter after ``max_deliver``), heartbeats, consumer reconciliation."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TypeVar

from nats.aio.msg import Msg
from opentelemetry.trace import SpanKind
from pydantic import BaseModel

from shared import subjects as S
from shared.bus.acks import LingeringAcks
from shared.bus.errors import TryLater, Undecodable
from shared.bus.gate import Presence
from shared.bus.infra import ConsumerSpec, consumer_config, consumer_drift
from shared.bus.letters import Letters
from shared.bus.pulls import Handler, PullFeed, _Pull, _Requeue, _RunLocks
from shared.bus.wire import (
    _stream_seq,
    ack_consumer,
    handled,
    handling,
    hung_every_time,
    num_delivered,
    stored_age_s,
)

log = logging.getLogger("loopwarden.bus")
M = TypeVar("M", bound=BaseModel)

MIN_RETRY_S = 0.1  # the shortest wait before a handler that said "try later" is tried again in place
_DELIVERIES: contextvars.ContextVar[int] = contextvars.ContextVar("lw_deliveries", default=1)


def current_deliveries() -> int:
    """How many times the message the running handler works on has been delivered (1 = first)."""
    return _DELIVERIES.get()


_SUBJECT: contextvars.ContextVar[str] = contextvars.ContextVar("lw_subject", default="")
_MSG: contextvars.ContextVar[Msg | None] = contextvars.ContextVar("lw_msg", default=None)


def current_seq() -> int:
    """The stream sequence of the message the running handler works on (a letter's number, for a consumer of
    LW_DLQ); 0 for a dead letter handed back (its command's sequence is not the message's). Read from its
    reply subject when asked, not on every delivery."""
    msg = _MSG.get()
    return _stream_seq(msg) if msg is not None else 0


def current_subject() -> str:
    """The subject the message the running handler works on arrived on (an identity token the server's
    permissions guarantee, e.g. the tenant of ``cmd.run.submit.<tenant>``)."""
    return _SUBJECT.get()


class Consuming(Letters):
    _pulls: list[_Pull]  # every durable this replica consumes, its requeue durables included
    _unstarted: list[_Pull]  # registered after the start: pulled once reconciled
    _run_locks: _RunLocks  # one run's messages one after another in this replica, across its durables
    presence: Presence  # the tenants with messages held in this replica (``gate.FairGate`` shares only then)

    def _init_state(self) -> None:
        super()._init_state()
        self._pulls = []
        self._unstarted = []
        self._run_locks = _RunLocks()
        self.presence = Presence()
        # a handled message's ack rides the connection's next write (``acks``)
        self._acks = LingeringAcks(lambda: self.nc, lambda coro, name: self._spawn(coro, name=name))

    async def _requeue(self, msg: Msg) -> None:
        """Run a dead letter handed back (``Requeue``) through the consumer that takes it: ``Requeueing``'s."""
        raise NotImplementedError

    def _feed(self) -> PullFeed:
        """What a pull consumer of this replica is handed (``pulls.PullFeed``)."""
        return PullFeed(
            service=self.service,
            limit=self.settings.in_flight_for(self.service),
            lookahead=self.settings.lookahead_for(self.service),
            headroom=self.settings.dispatch_headroom,
            yield_share=self.settings.dispatch_yield,
            locks=self._run_locks,
            presence=self.presence,
            deliver=self._deliver,
            span=self._processing if self._tracer is not None else None,
        )

    def _processing(self, msg: Msg) -> AbstractContextManager[None]:
        """The span a delivery of ``msg`` runs in: the consumer's, in the trace the message carries."""
        return self._span(f"{S.stem(msg.subject)} process", SpanKind.CONSUMER, self._extract(msg.headers), msg.headers)

    @property
    def consumer_specs(self) -> list[ConsumerSpec]:
        """The durable consumers this process declared (what bootstrap creates for it)."""
        return list(self._consumers)

    def missing_consumers(self) -> list[str]:
        """Why each durable this replica consumes from is not there (deleted under it): empty when all are."""
        return [p.missing for p in self._pulls if p.missing]

    async def reconcile_consumers(self) -> None:
        """Make (or wait for) every declared durable, then consume the ones registered since the start: pulling
        before its durable exists would be answered "no responders", read as a durable deleted under this replica,
        and asked again only every few seconds (a tool mounted late would look unhosted meanwhile)."""
        for spec in self._consumers:
            await self._reconcile_consumer(spec)
        starting, self._unstarted = self._unstarted, []
        for pull in starting:
            await pull.start(self.nc, self.js)

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
        # ack_wait / max_deliver in settings takes effect.
        cfg = consumer_config(spec, self.settings)
        await self.until_ready(f"consumer {spec.stream}/{spec.durable}", lambda: self.js.add_consumer(spec.stream, cfg))

    # --- consuming ---------------------------------------------------------------------------
    def consumer(
        self,
        *,
        durable: str,
        filter_subjects: list[str],
        model: type[M],
        stream: str | None = None,
        requeue_scope: str | None = None,
    ) -> Callable[[Handler[M]], Handler[M]]:
        """Register ``handler(payload)`` on a durable JetStream pull consumer.
        Its dead letters are handed back on ``S.requeue(service, requeue_scope)``: a scope for consumers
        that not every replica of the service has (the executor's per hosted tool).

        The bus drives the pull subscription itself (no framework per message): up to
        ``LW_MAX_IN_FLIGHT`` messages of this replica run at once, messages of one run are
        handled one after another (a lock per ``Lw-Run-Id``), every in-flight message is
        heartbeaten. ``stream``: the one whose subjects hold the filter (``S.stream_for``) unless named."""
        stream = stream or S.stream_for(filter_subjects[0]) or S.STREAM_CMD
        spec = ConsumerSpec(stream, durable, tuple(filter_subjects), self.service)
        self._consumers.append(spec)

        def register(handler: Handler[M]) -> Handler[M]:
            pulls: list[_Pull] = [_Pull(spec, model, handler, self._feed())]
            # A service that consumes anything can be handed its dead letters back: its requeue durable is
            # declared with its first consumer of that scope (bootstrap and the start-up checks see it).
            to = S.requeue(self.service, requeue_scope)
            self._requeue_to[durable] = to
            if not any(isinstance(p, _Requeue) and p.spec.filter_subjects == (to,) for p in self._pulls):
                requeue = ConsumerSpec(
                    S.stream_for(to) or S.STREAM_SUBMIT,
                    S.requeue_durable(self.service, requeue_scope),
                    (to,),
                    self.service,
                )
                self._requeue_to[requeue.durable] = to  # a requeue that fails again is handed back the same way
                self._consumers.append(requeue)
                pulls.append(_Requeue(requeue, self._requeue, self._feed()))
            self._pulls += pulls
            if self._started:  # registered after start (e.g. tools mounted late): consumed once its durable exists
                self._unstarted += pulls
            return handler

        return register

    async def _deliver(
        self, msg: Msg, model: type[M], handler: Handler[M], *, earlier: int = 0, requeued_from: int | None = None
    ) -> bool:
        """Decode, run the handler, then ack; dead-letter what cannot be delivered, with its reason.
        A requeued letter (``requeued_from``) comes through here too: ``earlier`` deliveries happened
        before it was dead-lettered, so its handler sees a redelivery, and the limits count this life's.
        True when the handler ran through and the message was acked."""
        deliveries = num_delivered(msg.reply)
        limit = self.settings.max_deliver
        if deliveries > 1 and self.bus_metrics is not None:
            self.bus_metrics.redelivered(ack_consumer(msg.reply), msg.subject)

        async def give_up(reason: str) -> None:
            await self.dead_letter(msg, reason, earlier + deliveries, requeued_from=requeued_from)
            await msg.ack()

        if hung_every_time(deliveries, limit, stored_age_s(msg.reply, time.time_ns()), self.settings.ack_wait_s):
            # It never completed: the handler crashed its process (or hung) on every delivery.
            # Dead-letter it *before* running the handler again.
            await give_up(f"not completed after {deliveries - 1} deliveries (the handler crashed or hung)")
            return False
        if deliveries > limit:
            log.warning(
                "%s: %s comes on delivery %d, sooner than %d ack waits: it was handed back, not crashed on; run again",
                self.service,
                msg.subject,
                deliveries,
                limit,
            )
        try:
            payload = await self._decode(model, msg)
        except Undecodable as err:
            await give_up(str(err))
            return False
        token = _DELIVERIES.set(earlier + deliveries)
        subject_token = _SUBJECT.set(msg.subject)
        msg_token = _MSG.set(msg if requeued_from is None else None)
        tenant_token = handling(msg.headers)  # what the handler publishes carries on the message's tenant
        waited: TryLater | None = None
        started = time.monotonic()
        try:
            # A dependency that is not ready (``TryLater``: the governor restarting) is retried here, the
            # message held under its heartbeat, for up to the ack wait counted from this delivery, so an
            # outage spends no delivery (deliveries count crashes: ``max_deliver`` of them dead-letter the
            # message); past that, or when the service stops, the message is handed back for later. A wait
            # on a replica that shows it is alive (``while_alive``) is held for as long as it lasts.
            while True:
                try:
                    await handler(payload)
                    break
                except TryLater as later:
                    held = time.monotonic() - started
                    past = held + later.delay > self.settings.ack_wait_s and not later.while_alive
                    if not later.in_place or self._stopping or past:
                        waited = later
                        break
                    log.info("%s: retry later (%s)", self.service, later)
                    await asyncio.sleep(max(later.delay, MIN_RETRY_S))
                    if self._stopping:
                        waited = later
                        break
                    _DELIVERIES.set(earlier + deliveries + 1)  # taken again: a handler reuses what the last take stored
        except Exception as err:
            if deliveries >= limit:
                log.exception("%s: giving up on %s after %d deliveries", self.service, msg.subject, deliveries)
                await give_up(f"handler failed {deliveries} times: {err!r}")
                return False
            log.warning("%s: handler failed on %s (delivery %d): %r", self.service, msg.subject, deliveries, err)
            await msg.nak(delay=self.settings.redeliver_delay_s * 2 ** (deliveries - 1))
            return False
        finally:
            _DELIVERIES.reset(token)
            _SUBJECT.reset(subject_token)
            _MSG.reset(msg_token)
            handled(tenant_token)
        if waited is None:
            await self._acks.ack(msg)
            return True
        if deliveries >= limit:  # not ready through every delivery: say so, not "crashed"
            log.error("%s: giving up on %s: %s", self.service, msg.subject, waited)
            held = time.monotonic() - started
            await give_up(f"still not ready after {deliveries} deliveries ({held:.0f}s on the last): {waited}")
        else:
            log.info("%s: retry later, handed back (%s)", self.service, waited)
            await msg.nak(delay=waited.delay)
        return False

    async def _heartbeats(self) -> None:
        """Every held message (running or waiting for a slot) is heartbeaten once its ack wait is a third gone, so
        it is never redelivered while held: a tick every sixth of the ack wait sends ``in_progress`` to those due
        (at most half the ack wait old by then), none to the many handled within a third of it."""
        age = max(0.2, self.settings.ack_wait_s / 3)
        interval = age / 2
        due = time.monotonic() + interval
        while True:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            late = time.monotonic() - due
            if late > self.settings.ack_wait_s / 2:  # the event loop was busy: say why messages come back
                log.warning(
                    "%s: heartbeats %.1fs late (the event loop was busy or starved of CPU): messages held "
                    "here may be redelivered after LW_ACK_WAIT_S (%gs)",
                    self.service,
                    late,
                    self.settings.ack_wait_s,
                )
            due = time.monotonic() + interval
            now = time.monotonic()
            held = [m for pull in self._pulls for m in pull.due(now, age)]
            for m in held:
                with contextlib.suppress(Exception):
                    await m.in_progress()
