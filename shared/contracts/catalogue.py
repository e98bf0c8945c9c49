"""The contract catalogue (``lw_contracts``) as a service reads it: one freshness rule for every reader.

A contract re-registered by an executor is seen within ``FRESH_S``. ``all()`` lists the bucket (the
planner offers every tool); ``get(tool)`` reads one key (the validator checks one tool's output). Off the
step's path: a read older than half of ``FRESH_S`` is served and read again in the background, so a reader
that keeps handling steps never waits for a listing; one older than ``FRESH_S`` is read before it is used.
"""

from __future__ import annotations

import asyncio
import time

from shared import opcounts
from shared import subjects as S
from shared.aio import retrieved
from shared.bus import Bus, kv_scan
from shared.messages import ToolContract

FRESH_S = 2.0  # how long a read of the catalogue is used before reading again


class ContractCatalogue:
    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self._listed: tuple[float, dict[str, ToolContract]] = (0.0, {})
        self._listing: asyncio.Task[dict[str, ToolContract]] | None = None  # one listing at a time
        self._read: dict[str, tuple[float, ToolContract]] = {}
        self._reading: dict[str, asyncio.Task[ToolContract | None]] = {}  # per tool: a read in the background

    def cached(self) -> dict[str, ToolContract] | None:
        """The registered tools as last listed, while that listing is fresh; else None."""
        listed_at, listed = self._listed
        return listed if listed and time.monotonic() - listed_at < FRESH_S else None

    async def all(self, refresh: bool = False) -> dict[str, ToolContract]:
        """Every registered tool's contract (``refresh``: list again now, e.g. when a call names a tool
        the last listing did not have)."""
        cached = self.cached()
        if not refresh and cached is not None:
            if time.monotonic() - self._listed[0] > FRESH_S / 2 and (self._listing is None or self._listing.done()):
                self._listing = asyncio.ensure_future(self._list())  # read ahead, in the background
                self._listing.add_done_callback(retrieved)
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
        age = time.monotonic() - read_at
        if contract is not None and age < FRESH_S:
            if age > FRESH_S / 2 and tool not in self._reading:  # read ahead, in the background
                task = self._reading[tool] = asyncio.ensure_future(self._get(tool))
                task.add_done_callback(retrieved)
                task.add_done_callback(lambda _: self._reading.pop(tool, None))
            return contract
        return await self._get(tool)

    async def _get(self, tool: str) -> ToolContract | None:
        read_at = time.monotonic()
        contract, _ = await self.bus.kv_get(S.KV_CONTRACTS, S.kv_key(tool), ToolContract)
        if contract is not None:
            self._read[tool] = (read_at, contract)
        return contract

    async def _list(self) -> dict[str, ToolContract]:
        """Every contract, read by one batched direct get of the bucket (not a listing of its keys and a
        get per key: a round trip per tool)."""
        listed_at = time.monotonic()
        await self.bus.kv(S.KV_CONTRACTS)  # created if missing (unmanaged), else it must exist
        opcounts.count("direct_get")
        stored, _ = await self.bus.through_failover(
            "list contracts", lambda: kv_scan(self.bus.nc, S.KV_CONTRACTS), repeatable=True
        )
        found: dict[str, ToolContract] = {}
        for m in stored.values():
            if m is not None and m.data:
                value = await self.bus.payloads.inflate_value(self.bus.nc, m.data)
                contract = ToolContract.model_validate_json(value)
                found[contract.name] = contract
        self._listed = (listed_at, found)
        return found
