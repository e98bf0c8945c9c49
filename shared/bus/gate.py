"""A fair gate inside a replica: at most ``limit`` sections of work run at once, and a place that frees goes to
the tenant running fewest per unit of weight (``fair.FairSlots``' rule, the one fair dispatch gives slots by).

Fair dispatch shares a durable's slots by tenant, but a slot is held for a whole handler, most of it spent waiting
on a model. The work after the wait (saving the run, publishing what it produced) is what takes the replica's CPU
and the server's, and a backlog's turns that end together (a burst's runs were admitted at once) all do it at the
same moment: every other tenant's step then waits for the CPU behind them. Run inside a gate, that work is served by
tenant as well: another tenant's section starts next rather than behind the backlog's, and a tenant alone has every
place. The tenant is the handled message's (``wire.current_tenant``) unless the section names it (a client's submit
carries none: its subject says whose it is)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from shared.bus.fair import FairSlots
from shared.bus.wire import current_tenant


class FairGate:
    """``async with gate.section(): ...`` runs when the current tenant is given a place (at once while there is
    room). ``limit`` 0: no gate, every section runs at once."""

    def __init__(self, limit: int, headroom: float = 0.25) -> None:
        self.limit = limit
        # the items are (tenant, the waiter to wake): a waiter cancelled before its turn gives its place on at once
        self._slots: FairSlots[tuple[str, asyncio.Future[None]]] = FairSlots(max(1, limit), headroom)

    @property
    def running(self) -> int:
        return self._slots.total

    def __len__(self) -> int:
        """Sections waiting for a place."""
        return len(self._slots)

    @contextlib.asynccontextmanager
    async def section(self, tenant: str | None = None, weight: float = 1.0) -> AsyncIterator[None]:
        """A section of ``tenant``'s (None: the handled message's tenant and weight)."""
        if self.limit <= 0:
            yield
            return
        if tenant is None:
            tenant, weight = current_tenant()
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._slots.arrive(tenant, (tenant, waiter), weight) is None:
            await waiter  # cancelled while waiting: ``_release`` passes the place on when it comes
        try:
            yield
        finally:
            self._release(tenant)

    def _release(self, tenant: str) -> None:
        ended = [tenant]
        while ended:
            for key, waiter in self._slots.done(ended.pop()):
                if waiter.done():  # its section was cancelled while it waited: the place goes on
                    ended.append(key)
                else:
                    waiter.set_result(None)
