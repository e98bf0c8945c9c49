"""The tools a planner offers: the contract catalogue (``lw_contracts``) as last listed, and whether a
running executor replica hosts a tool (its durable pulls or holds a call; ``hosting.py``)."""

from __future__ import annotations

from nats.js.errors import NotFoundError

from shared import opcounts
from shared import subjects as S
from shared.bus import Bus
from shared.contracts.catalogue import ContractCatalogue
from shared.messages import ToolContract


class Catalogue:
    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.readers = ContractCatalogue(bus)  # the one freshness rule every reader of lw_contracts keeps

    def cached(self) -> dict[str, ToolContract] | None:
        """The registered tools as last listed, while that listing is fresh; else None."""
        return self.readers.cached()

    async def contracts(self, refresh: bool = False) -> dict[str, ToolContract]:
        """Registered tools (``refresh`` when a call names a tool not in the listing)."""
        return await self.readers.all(refresh)

    async def hosted(self, tool: str) -> bool | None:
        """Whether a running executor replica takes ``tool``'s calls (its durable has a waiting pull request
        or a message in hand); None when the server cannot say now."""
        opcounts.count("js_api")
        try:
            info = await self.bus.js.consumer_info(S.STREAM_CMD, S.executor_durable(tool), timeout=2)
        except NotFoundError:
            return False
        except Exception:  # a timeout, a leader election: dispatch as before
            return None
        return bool(info.num_waiting or info.num_ack_pending)
