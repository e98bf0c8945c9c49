"""Acks that ride the connection's next write: what every durable consumer of a service acks with
(``consuming.Consuming``), and what ``bench/bus_floor.py`` measures the bus's floor with.

An ack is a message of its own; sent the moment its handler returns, it costs a wake-up of nats-py's flusher,
a write and a read in nats-server, for nothing anyone waits on. Sent with the next write (a step later, at one
run: the service's next publish), it costs neither. A process that dies inside the window has its message
delivered again once the ack wait passes, as when it dies inside the handler: every handler takes a
redelivery (the run's transaction, the tool ledger, de-duplication by id).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg

from shared.bus import natsx

ACK_LINGER_S = 0.02
"""How long an ack may wait for the connection's next write before it is sent alone (at most twice this)."""


class LingeringAcks:
    """Acks of one connection (``connection()``: the bus's, once connected), queued for its next write; a timer
    writes them after ``ACK_LINGER_S`` when no write came. ``spawn`` runs that write as a tracked task."""

    def __init__(
        self, connection: Callable[[], NatsClient], spawn: Callable[[Coroutine[Any, Any, None], str], object]
    ) -> None:
        self.connection, self.spawn = connection, spawn
        self._timer: asyncio.TimerHandle | None = None
        self._batch: object = None  # what was queued on the connection when the timer was armed

    async def ack(self, msg: Msg) -> None:
        """Ack a handled message with the connection's next write, or after ``ACK_LINGER_S`` (at most twice it)
        when none comes; the bytes are what ``msg.ack()`` sends: an empty message to its reply subject."""
        nc = self.connection()
        if not msg.reply or not natsx.is_connected(nc):
            await msg.ack()  # a connection reconnecting: nats-py's own path (it buffers)
            return
        await natsx.send_with_next_write(nc, f"PUB {msg.reply} 0\r\n\r\n".encode())
        if self._timer is None:
            self._arm()

    def _arm(self) -> None:
        self._batch = natsx.unwritten_batch(self.connection())
        self._timer = asyncio.get_running_loop().call_later(ACK_LINGER_S, self._flush)

    def _flush(self) -> None:
        """The acks queued when the timer was armed are written now if no write took them since. Acks queued
        after a write took those get a linger of their own (so an ack waits at most twice ``ACK_LINGER_S``):
        at one run a service writes once a step, and the ack of each step rides the next."""
        self._timer = None
        nc = self.connection()
        if not natsx.unwritten(nc):
            return
        if natsx.unwritten_batch(nc) is self._batch:
            self.spawn(natsx.flush(nc), "flush acks")
        else:
            self._arm()
