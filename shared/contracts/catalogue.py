"""The contract catalogue (``lw_contracts``) as a service reads it: one freshness rule for every reader.

A contract re-registered by an executor is seen within ``FRESH_S``. ``all()`` lists the bucket (the
planner offers every tool); ``get(tool)`` reads one key (the validator checks one tool's output).
"""

from __future__ import annotations

import asyncio
import time

from shared import subjects as S
from shared.bus import Bus
from shared.messages import ToolContract

FRESH_S = 2.0  # how long a read of the catalogue is used before reading again


class ContractCatalogue:
    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self._listed: tuple[float, dict[str, ToolContract]] = (0.0, {})
        self._listing: asyncio.Task[dict[str, ToolContract]] | None = None  # one listing at a time
        self._read: dict[str, tuple[float, ToolContract]] = {}

    def cached(self) -> dict[str, ToolContract] | None:
        """The registered tools as last listed, while that listing is fresh; else None."""
        listed_at, listed = self._listed
        return listed if listed and time.monotonic() - listed_at < FRESH_S else None

    async def all(self, refresh: bool = False) -> dict[str, ToolContract]:
        """Every registered tool's contract (``refresh``: list again now, e.g. when a call names a tool
        the last listing did not have)."""
        cached = self.cached()
        if not refresh and cached is not None:
            return cached
        # One listing at a time: the many messages in flight when the listing expires share it (each
        # listing is a consumer on the bucket plus a get per contract, not a step's worth of work).
        started = time.monotonic()
        listing = self._listing
        if listing is None or listing.done():
            listing = self._listing = asyncio.ensure_future(self._list())
        found = await asyncio.shield(listing)
        if refresh and self._listed[0] < started:  # the shared listing began before this caller asked
            return await self.all(refresh=True)
        return found

    async def get(self, tool: str) -> ToolContract | None:
        """``tool``'s contract, or None when no executor registered it."""
        read_at, contract = self._read.get(tool, (0.0, None))
        if contract is not None and time.monotonic() - read_at < FRESH_S:
            return contract
        contract, _ = await self.bus.kv_get(S.KV_CONTRACTS, S.kv_key(tool), ToolContract)
        if contract is not None:
            self._read[tool] = (time.monotonic(), contract)
        return contract

    async def _list(self) -> dict[str, ToolContract]:
        listed_at = time.monotonic()
        found = {c.name: c for c in (await self.bus.kv_values(S.KV_CONTRACTS, ToolContract)).values()}
        self._listed = (listed_at, found)
        return found
