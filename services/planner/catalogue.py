"""The tools a planner offers: the contract catalogue (``lw_contracts``) as last listed, and whether a
running executor replica hosts a tool (its durable pulls or holds a call; ``hosting.py``)."""

from __future__ import annotations

import asyncio
import time

from nats.js.errors import NotFoundError

from shared import subjects as S
from shared.bus import Bus
from shared.messages import ToolContract

CONTRACTS_FRESH_S = 2.0  # how long a listing of the registered tools is used before listing again


class Catalogue:
    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self._contracts: tuple[float, dict[str, ToolContract]] = (0.0, {})
        self._fetch: asyncio.Task[dict[str, ToolContract]] | None = None  # one listing at a time

    def cached(self) -> dict[str, ToolContract] | None:
        """The registered tools as last listed, while that listing is fresh (2 s); else None."""
        fetched_at, cached = self._contracts
        return cached if cached and time.monotonic() - fetched_at < CONTRACTS_FRESH_S else None

    async def contracts(self, refresh: bool = False) -> dict[str, ToolContract]:
        """Registered tools (cached for 2 s; ``refresh`` when a call names a tool not in the cache)."""
        cached = self.cached()
        if not refresh and cached is not None:
            return cached
        # One listing at a time: the many messages in flight when the cache expires share it (each
        # listing is a consumer on the bucket plus a get per contract, not a step's worth of work).
        started = time.monotonic()
        fetch = self._fetch
        if fetch is None or fetch.done():
            fetch = self._fetch = asyncio.ensure_future(self._list())
        found = await asyncio.shield(fetch)
        if refresh and self._contracts[0] < started:  # the shared listing began before this caller asked
            return await self.contracts(refresh=True)
        return found

    async def _list(self) -> dict[str, ToolContract]:
        listed_at = time.monotonic()
        found = {c.name: c for c in (await self.bus.kv_values(S.KV_CONTRACTS, ToolContract)).values()}
        self._contracts = (listed_at, found)
        return found

    async def hosted(self, tool: str) -> bool | None:
        """Whether a running executor replica takes ``tool``'s calls (its durable has a waiting pull request
        or a message in hand); None when the server cannot say now."""
        try:
            info = await self.bus.js.consumer_info(S.STREAM_CMD, S.executor_durable(tool), timeout=2)
        except NotFoundError:
            return False
        except Exception:  # a timeout, a leader election: dispatch as before
            return None
        return bool(info.num_waiting or info.num_ack_pending)
