"""What the server relays, as a plain NATS subscriber sees it: for tests that count messages on the wire."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from nats.aio.msg import Msg

from loopwarden.client import Client
from tests.support.timing import bound


@dataclass
class Seen:
    subject: str
    reply: str
    data: bytes
    headers: dict[str, str]


class Wire:
    """Every message the server relays on ``subjects``, in the order it relays them."""

    def __init__(self, client: Client, *subjects: str) -> None:
        self.client, self.subjects = client, subjects
        self.seen: list[Seen] = []
        self.subs: list[Any] = []

    async def __aenter__(self) -> Wire:
        async def cb(msg: Msg) -> None:
            self.seen.append(Seen(msg.subject, msg.reply, msg.data, dict(msg.headers or {})))

        nc = self.client.bus.nc
        for subject in self.subjects:
            self.subs.append(await nc.subscribe(subject, cb=cb))
        await nc.flush()
        return self

    async def __aexit__(self, *_: object) -> None:
        await asyncio.sleep(bound(0.3))  # what is in flight reaches us
        for sub in self.subs:
            await sub.unsubscribe()
