"""The reply collector: answers to this connection's JetStream requests (PubAcks, direct gets)
by one wildcard inbox subscription."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError

from shared import opcounts
from shared.bus.wire import publish_raw


class _Replies:
    """The answers to this connection's JetStream requests (PubAcks, direct gets), collected by one
    wildcard inbox subscription: a request is a plain publish with ``<inbox>.<n>`` as its reply and a
    future resolved by the answer - no inbox token, ``wait_for``, timer or task per request as
    ``nc.request`` makes. Timeouts are kept by one sweeper that runs while answers are awaited: an
    answer not in by its deadline (``LW_JS_TIMEOUT_S`` after sending, noticed within a tick) fails
    with ``NatsTimeoutError``. An answer nobody waits for any more (timed out, or a duplicate) is dropped.
    ``connection`` gives the bus's connection (there is none until it connects)."""

    def __init__(self, connection: Callable[[], NatsClient], timeout_s: float) -> None:
        self.connection, self.timeout_s = connection, timeout_s
        self.prefix = ""
        self.waiting: dict[str, tuple[asyncio.Future[Msg], float]] = {}  # token -> (future, deadline)
        self._count = itertools.count(1)
        self._starting: asyncio.Future[None] | None = None
        self._sweeper: asyncio.Task[None] | None = None

    async def _start(self) -> None:
        nc = self.connection()
        prefix = nc.new_inbox() + "."  # under this service's inbox prefix (permissions)
        await nc.subscribe(prefix + "*", cb=self._on_reply)
        self.prefix = prefix

    async def ready(self) -> None:
        if self.prefix:
            return
        if self._starting is None:  # the first request subscribes; concurrent ones wait for it
            self._starting = asyncio.get_running_loop().create_future()
            try:
                await self._start()
            except BaseException as err:
                starting, self._starting = self._starting, None
                starting.set_exception(err)
                starting.exception()  # retrieved: the waiters (if any) raise it themselves
                raise
            self._starting.set_result(None)
        else:
            await asyncio.shield(self._starting)

    async def _on_reply(self, msg: Msg) -> None:
        waiting = self.waiting.pop(msg.subject[len(self.prefix) :], None)
        if waiting is not None and not waiting[0].done():
            waiting[0].set_result(msg)

    async def _sweep(self) -> None:
        """Fail what is past its deadline; end when nothing is awaited (``send`` starts it again)."""
        loop = asyncio.get_running_loop()
        tick = min(0.25, self.timeout_s / 5)
        try:
            while self.waiting:
                await asyncio.sleep(tick)
                now = loop.time()
                late = [token for token, (fut, deadline) in self.waiting.items() if deadline <= now or fut.done()]
                for token in late:
                    fut, _ = self.waiting.pop(token)
                    if not fut.done():
                        fut.set_exception(NatsTimeoutError())
        finally:
            self._sweeper = None

    async def send(self, subject: str, body: bytes, headers: dict[str, str] | None) -> tuple[str, asyncio.Future[Msg]]:
        """Publish a request; its answer (or ``NatsTimeoutError``) resolves the returned future."""
        if not self.prefix:
            await self.ready()
        loop = asyncio.get_running_loop()
        token = str(next(self._count))
        fut: asyncio.Future[Msg] = loop.create_future()
        self.waiting[token] = (fut, loop.time() + self.timeout_s)
        try:
            await publish_raw(self.connection(), subject, body, self.prefix + token, headers)
            opcounts.note(subject)
        except BaseException:
            self.waiting.pop(token, None)
            fut.cancel()
            raise
        if self._sweeper is None:
            self._sweeper = loop.create_task(self._sweep(), name="reply timeouts")
        return token, fut

    def close(self) -> None:
        """The connection is closed: nothing will answer; stop the sweeper, fail what still waits."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        waiting, self.waiting = self.waiting, {}
        for fut, _ in waiting.values():
            if not fut.done():
                fut.set_exception(NatsTimeoutError())

    @staticmethod
    async def wait(sent: list[tuple[str, asyncio.Future[Msg]]]) -> None:
        """Wait until every future of ``sent`` has its answer or its timeout."""
        for _, fut in sent:
            if not fut.done():
                try:
                    await fut
                except NatsTimeoutError:
                    pass

    def forget(self, sent: list[tuple[str, asyncio.Future[Msg]]]) -> None:
        """Stop waiting for the answers still open in ``sent`` (their futures are cancelled)."""
        for token, fut in sent:
            if not fut.done():
                self.waiting.pop(token, None)
                fut.cancel()

    async def request(self, subject: str, body: bytes, headers: dict[str, str] | None) -> Msg:
        """One request and its answer; ``NatsTimeoutError`` if none came within ``LW_JS_TIMEOUT_S``."""
        _, fut = await self.send(subject, body, headers)
        return await fut
