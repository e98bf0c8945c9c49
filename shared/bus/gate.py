"""A fair gate inside a replica: at most ``limit`` sections of work run at once, and a place that frees goes to
the tenant running fewest per unit of weight (``fair.FairSlots``' rule, the one fair dispatch gives slots by).

Fair dispatch shares a durable's slots by tenant, but a slot is held for a whole handler, most of it spent waiting
on a model. The work after the wait (saving the run, publishing what it produced) is what takes the replica's CPU
and the server's, and a backlog's turns that end together (a burst's runs were admitted at once) all do it at the
same moment: every other tenant's step then waits for the CPU behind them. Run inside a gate, that work is served by
tenant as well: another tenant's section starts next rather than behind the backlog's. The tenant is the handled
message's (``wire.current_tenant``) unless the section names it (a client's submit carries none: its subject says
whose it is).

The bound is only kept while there is another tenant to share with (``Presence``): a tenant alone in the replica
runs every section at once. Bounding a lone tenant's commits shared nothing and cost the whole stack CPU: its
saves and publishes went out sixteen at a time instead of together, so every process downstream (nats-server, the
executors, the validator, the governor) woke up for fewer messages each time (measured: 9.4-12.4 ms against
14.3-15.5 ms of CPU per finished run for a lone tenant's burst, docs/benchmarks.md)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

from shared.bus.fair import FairSlots
from shared.bus.wire import current_tenant

LINGER_S = 1.0  # how long a tenant whose last message here was handled still counts as present


class Presence:
    """The tenants with work in this replica: a message fetched from any of its durables (running, or held for a
    slot) and not yet handled, or their last one handled less than ``linger_s`` ago (a run's next message is often
    on its way: a tool's outcome, the next turn). Pure bookkeeping, fed by the pull consumers (``pulls.py``)."""

    def __init__(self, linger_s: float = LINGER_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.linger_s, self._clock = linger_s, clock
        self._held: dict[str, int] = {}  # per tenant, its messages here now
        self._left: dict[str, float] = {}  # per tenant with none here now, when its last one was handled

    def arrive(self, tenant: str) -> None:
        self._held[tenant] = self._held.get(tenant, 0) + 1
        self._left.pop(tenant, None)

    def leave(self, tenant: str) -> None:
        left = self._held.get(tenant, 0) - 1
        if left > 0:
            self._held[tenant] = left
            return
        self._held.pop(tenant, None)
        self._left[tenant] = self._clock()

    def others(self, tenant: str) -> bool:
        """Whether a tenant other than ``tenant`` has work here, or had within ``linger_s``."""
        held = self._held
        if len(held) > 1 or (held and tenant not in held):
            return True
        if not self._left:
            return False
        since = self._clock() - self.linger_s
        for key in [k for k, at in self._left.items() if at < since]:
            del self._left[key]
        return any(key != tenant for key in self._left)


class FairGate:
    """``async with gate.section(): ...`` runs when the current tenant is given a place (at once while there is
    room, or while no other tenant is ``present``). ``limit`` 0: no gate, every section runs at once. Without a
    ``presence`` the bound is always kept."""

    def __init__(self, limit: int, headroom: float = 0.25, presence: Presence | None = None) -> None:
        self.limit = limit
        self.presence = presence
        self.loose = 0  # sections running unbounded (no other tenant was present when they began)
        # the items are (tenant, the waiter to wake): a waiter cancelled before its turn gives its place on at once
        self._slots: FairSlots[tuple[str, asyncio.Future[None]]] = FairSlots(max(1, limit), headroom)

    @property
    def running(self) -> int:
        return self._slots.total + self.loose

    def __len__(self) -> int:
        """Sections waiting for a place."""
        return len(self._slots)

    def shared(self, tenant: str) -> bool:
        """Whether ``tenant``'s section is to be bounded now: another tenant is present in the replica, or has
        sections in the gate."""
        if self.presence is None or self._slots.others(tenant):
            return True
        return self.presence.others(tenant)

    @contextlib.asynccontextmanager
    async def section(self, tenant: str | None = None, weight: float = 1.0) -> AsyncIterator[None]:
        """A section of ``tenant``'s (None: the handled message's tenant and weight)."""
        if self.limit <= 0:
            yield
            return
        if tenant is None:
            tenant, weight = current_tenant()
        if not self.shared(tenant):  # alone here: nobody to share with, nothing to bound
            self.loose += 1
            try:
                yield
            finally:
                self.loose -= 1
            return
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
