"""Driving a durable pull consumer on nats-py: pull requests sized to the free slots and a lookahead, the
messages beyond the free slots waiting per tenant for fair dispatch (``fair.py``), each message its own task,
one lock per run id; and the requeue durable's variant."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, TypeVar

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.client import JetStreamContext
from pydantic import BaseModel

from shared import opcounts
from shared import subjects as S
from shared.bus.fair import FairSlots
from shared.bus.gate import Presence
from shared.bus.infra import ConsumerSpec
from shared.bus.wire import RUN_ID_HEADER, tenant_of
from shared.messages import Requeue

log = logging.getLogger("loopwarden.bus")
M = TypeVar("M", bound=BaseModel)

Handler = Callable[[M], Awaitable[None]]
PULL_EXPIRES_S = 5.0  # a pull request's lifetime; a new one is sent as slots free up


class _RunLocks:
    """One lock per run id, dropped when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    async def acquire(self, key: str) -> None:
        """Take the run's lock (``release`` it after); ``hold`` without a context manager per message."""
        lock, users = self._locks.get(key, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._locks[key] = (lock, users + 1)
        try:
            await lock.acquire()
        except BaseException:  # cancelled while waiting
            self._drop(key)
            raise

    def release(self, key: str) -> None:
        self._locks[key][0].release()
        self._drop(key)

    def _drop(self, key: str) -> None:
        lock, users = self._locks[key]
        if users <= 1:
            del self._locks[key]
        else:
            self._locks[key] = (lock, users - 1)


@dataclass(frozen=True)
class PullFeed:
    """What a pull consumer is handed by the bus that registers it (it reaches into nothing else): whose it
    is, how many of its messages run at once and are held beyond that, the run locks every durable of the
    replica shares, what delivers a message into its handler, and the span a delivery runs in (None: not
    traced). The connection is handed to ``_Pull.start``: there is none yet when a handler is registered."""

    service: str
    limit: int  # messages running at once (``LW_MAX_IN_FLIGHT``)
    lookahead: int  # messages held beyond those, waiting for a slot
    headroom: float  # ``FairSlots``' room past the limit
    yield_share: bool  # ``FairSlots``: a tenant at its share takes no freed slot while another runs here
    locks: _RunLocks
    presence: Presence  # the tenants with messages held in the replica, every durable together (``gate.py``)
    deliver: Callable[[Msg, type[Any], Handler[Any]], Awaitable[bool]]
    span: Callable[[Msg], AbstractContextManager[None]] | None


class _Pull:
    """One durable pull consumer driven directly on nats-py: pull requests ask for as many
    messages as there are free slots, plus a lookahead; each delivered message runs as its own task
    once it has a slot. Messages beyond the free slots wait here (heartbeaten like running ones), per
    tenant: a slot that frees goes to the tenant holding fewest per unit of weight (``FairSlots``), so a
    tenant's message fetched behind another's backlog is not handled after all of it."""

    def __init__(self, spec: ConsumerSpec, model: type[Any], handler: Handler[Any], feed: PullFeed) -> None:
        self.spec, self.model, self.handler, self.feed = spec, model, handler, feed
        self.service = feed.service
        self.limit = feed.limit
        self.window = self.limit + feed.lookahead  # messages held at most
        self.held: dict[int, Msg] = {}  # id(msg) -> msg (nats-py messages are not hashable): running or waiting
        self.acked_wait: dict[int, float] = {}  # id(msg) -> when its ack wait began (delivered or heartbeaten)
        # which held message gets a slot: by tenant, fair share (running ones count against their tenant)
        self.slots: FairSlots[Msg] = FairSlots(self.limit, feed.headroom, feed.yield_share)
        self.tasks: set[asyncio.Task[None]] = set()
        self.pending = 0  # messages asked for and not yet delivered
        self.requests: deque[float] = deque()  # expiry time of each live pull request
        self.wake = asyncio.Event()
        self.stopping = False
        self.sub: Subscription | None = None
        self.loop_task: asyncio.Task[None] | None = None
        # why this durable is not consuming (it was deleted: ``/readyz`` names it), or None
        self.missing: str | None = None
        self._verifying: asyncio.Task[None] | None = None

    async def start(self, nc: NatsClient, js: JetStreamContext) -> None:
        """Start pulling on ``nc`` (connected); ``js`` is asked whether the durable is still there."""
        self.nc, self.js = nc, js
        self.inbox = nc.new_inbox()  # under this service's inbox prefix (permissions)
        self.next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{self.spec.stream}.{self.spec.durable}"
        self.sub = await nc.subscribe(self.inbox, cb=self.on_msg)
        self.loop_task = asyncio.create_task(self.loop(), name=f"pull {self.spec.durable}")

    async def on_msg(self, msg: Msg) -> None:
        try:
            await self._on_msg(msg)
        except Exception:  # nats-py would swallow it silently
            log.exception("%s: could not take a message on %s", self.service, self.spec.durable)

    async def _on_msg(self, msg: Msg) -> None:
        status = msg.headers.get("Status") if msg.headers else None
        if status:
            if status == "100":  # idle heartbeat
                return
            if status in ("409", "503") and self._verifying is None:
                # 409 "Consumer Deleted" on a waiting pull, 503 "no responders" on a new one: is it gone?
                self._verifying = asyncio.create_task(
                    self.verify(f"{status} {(msg.headers or {}).get('Description', '')}")
                )
            elif status in ("404", "408"):  # no messages / the pull expired: the durable is there
                self.missing = None
            left = msg.headers.get("Nats-Pending-Messages") if msg.headers else None
            self.pending = max(0, self.pending - int(left)) if left and left.isdigit() else 0
            if self.requests:
                self.requests.popleft()
            self.wake.set()
            return
        self.pending = max(0, self.pending - 1)
        self.missing = None
        if self.stopping:  # shutting down: hand it back at once
            with contextlib.suppress(Exception):
                await msg.nak()
            return
        self.held[id(msg)] = msg
        self.acked_wait[id(msg)] = time.monotonic()
        tenant, weight = self.tenant_of(msg)
        self.feed.presence.arrive(tenant)
        if self.slots.arrive(tenant, msg, weight) is not None:
            self.begin(msg, tenant)

    @staticmethod
    def tenant_of(msg: Msg) -> tuple[str, float]:
        """Whose work ``msg`` is, and that tenant's weight. A client's submit is its subject's tenant (the server
        lets a client publish only its own), never what its headers say: a client could write any there."""
        if msg.subject.startswith(S.RUN_SUBMIT_PREFIX + "."):  # ``<prefix>.<tenant>[.replay]`` as sent
            return S.as_sent(msg.subject)[len(S.RUN_SUBMIT_PREFIX) + 1 :].split(".", 1)[0], 1.0
        return tenant_of(msg.headers)

    def begin(self, msg: Msg, tenant: str) -> None:
        task = asyncio.create_task(self.run(msg, tenant))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def verify(self, status: str) -> None:
        """After a pull was answered ``status``: whether the durable still exists (a consumer deleted under a
        running replica - by hand, or a release that dropped it - makes it consume nothing, silently)."""
        from nats.js.errors import NotFoundError

        try:
            await self.js.consumer_info(self.spec.stream, self.spec.durable)
            self.missing = None
        except NotFoundError:
            self.missing = (
                f"consumer {self.spec.stream}/{self.spec.durable} is gone (deleted under this replica): "
                "run `loopwarden bootstrap` as the admin"
            )
            log.error("%s: %s", self.service, self.missing)
        except Exception as err:  # JetStream not answering: said by the connection's own state
            log.warning("%s: pull on %s answered %s; checking it failed: %r", self.service, self.spec.durable,
                        status.strip(), err)  # fmt: skip
        finally:
            self._verifying = None

    async def run(self, msg: Msg, tenant: str) -> None:
        opcounts.count("delivered")
        try:
            run_id = self.run_of(msg)
            locks = self.feed.locks
            if run_id:
                await locks.acquire(run_id)
            try:
                if self.feed.span is None:
                    await self.deliver(msg)
                else:
                    with self.feed.span(msg):
                        await self.deliver(msg)
            finally:
                if run_id:
                    locks.release(run_id)
        except asyncio.CancelledError:  # shutdown ran out of time: hand the message back
            with contextlib.suppress(Exception):
                await msg.nak()
            raise
        except Exception:
            log.exception("%s: delivering %s failed; it will be redelivered", self.service, msg.subject)
        finally:
            self.drop(msg)
            for held in self.slots.done(tenant):  # the slot goes to whoever is owed it
                self.begin(held, self.tenant_of(held)[0])
            self.wake.set()

    def drop(self, msg: Msg) -> None:
        """``msg`` is no longer held here (acked, handed back or dead-lettered)."""
        if self.held.pop(id(msg), None) is not None:
            self.feed.presence.leave(self.tenant_of(msg)[0])
        self.acked_wait.pop(id(msg), None)

    def due(self, now: float, age: float) -> list[Msg]:
        """The held messages whose ack wait began ``age`` ago or more, marked as heartbeaten ``now``: a message is
        heartbeaten when its ack wait needs it, not at every tick (most are handled long before)."""
        out = []
        for key, began in self.acked_wait.items():
            if now - began >= age and (msg := self.held.get(key)) is not None:
                out.append(msg)
                self.acked_wait[key] = now
        return out

    def run_of(self, msg: Msg) -> str | None:
        """The run whose messages this one waits behind (one at a time per run in a replica)."""
        return msg.headers.get(RUN_ID_HEADER) if msg.headers else None

    async def deliver(self, msg: Msg) -> None:
        await self.feed.deliver(msg, self.model, self.handler)

    async def loop(self) -> None:
        nc = self.nc
        while not self.stopping:
            now = time.monotonic()
            while self.requests and self.requests[0] < now - 0.5:  # expired without a status reaching us
                self.requests.popleft()
            if not self.requests:
                self.pending = 0
            free = self.window - len(self.held) - self.pending
            if free > 0 and (self.pending == 0 or free >= max(1, self.limit // 4)):
                req = {"batch": free, "expires": int(PULL_EXPIRES_S * 1e9)}
                try:
                    await nc.publish(self.next_subject, json.dumps(req).encode(), reply=self.inbox)
                    opcounts.count("pull")
                    self.pending += free
                    self.requests.append(now + PULL_EXPIRES_S)
                except Exception as err:  # disconnected: try again shortly
                    log.warning("%s: pull request for %s failed: %r", self.service, self.spec.durable, err)
                    await asyncio.sleep(0.5)
                    continue
            self.wake.clear()
            if self.missing is not None:  # no durable to pull from: ask again now and then, not in a loop
                await asyncio.sleep(PULL_EXPIRES_S / 2)
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(PULL_EXPIRES_S / 2):
                    await self.wake.wait()

    async def stop(self, grace: float) -> None:
        """Stop asking for messages, let in-flight ones finish within ``grace``, hand back the rest.

        The inbox is unsubscribed first: the server drops this replica's waiting pull requests (no interest),
        so no more messages come here. Kept until the in-flight ones were done, every message the server sent
        on an outstanding request was handed back at once (``nak``) and could come straight back on the next
        one, each bounce a delivery: five of them and a peer dead-lettered the message as crashing on every
        delivery (a rolling upgrade did this to a run's ``tool.succeeded``). The in-flight messages are
        acked and heartbeaten on their own reply subjects, which need no inbox."""
        self.stopping = True
        self.wake.set()
        if self.loop_task is not None:
            self.loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.loop_task
        if self.sub is not None:
            with contextlib.suppress(Exception):
                await self.sub.unsubscribe()
            self.sub = None
        # Messages waiting for a slot are handled as slots free (each handed back now would spend a delivery);
        # what is still waiting or running when the grace is up is handed back.
        deadline = time.monotonic() + grace
        while self.tasks and (left := deadline - time.monotonic()) > 0:
            await asyncio.wait(set(self.tasks), timeout=left, return_when=asyncio.FIRST_COMPLETED)
        for msg in self.slots.drain():
            self.drop(msg)
            with contextlib.suppress(Exception):
                await msg.nak()
        late = set(self.tasks)
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(late, timeout=2)


class _Requeue(_Pull):
    """A requeue durable (``requeue_<service>[_<scope>]``): a dead letter handed back (``Requeue``) is run
    by the service's consumer that takes its subject, as a redelivery of the message (``requeue``: the bus's
    ``_requeue``, which takes the received message itself, not its decoded body)."""

    def __init__(self, spec: ConsumerSpec, requeue: Callable[[Msg], Awaitable[None]], feed: PullFeed) -> None:
        super().__init__(spec, Requeue, requeue, feed)

    def run_of(self, msg: Msg) -> str | None:
        return None  # the run is the stored letter's, not what the requester's headers say: locked in ``_requeue``

    async def deliver(self, msg: Msg) -> None:
        await self.handler(msg)
