"""Fair dispatch inside one consumer: which message held by a replica gets a slot, by tenant.

A replica runs at most ``limit`` messages of a durable at once and holds a few more fetched (the lookahead).
A slot that frees goes to the tenant holding the fewest slots per unit of its weight (among equals, the one
served least lately, per unit of weight: stride scheduling), so a tenant's message fetched behind another
tenant's backlog is handled next, not after the backlog - the rule admission follows for runs. A tenant running fewer
than its share of the slots (``limit`` x its weight over the weights of the tenants with messages here) starts a
message at once even when every slot is taken, up to ``headroom`` x ``limit`` past it in all: slots free only as
handlers end (a model turn holds one for seconds), and the tenant that arrives at a consumer full of another's
work is owed its share now. Work-conserving: a tenant alone takes every slot. With ``yield_share``
(``LW_DISPATCH_YIELD``) a tenant holding its share takes no slot that frees while another tenant has items
running: not work-conserving between tenants, so that fewer of a backlog's handlers share the CPU with the other's.

Pure: no bus, no clock. A key is a tenant (``Lw-Tenant``; messages without one share the key ``""``). A key
that had nothing here is not owed service for the time it was idle (it starts level with the keys being served),
so it cannot take the consumer over when it comes back. Within a key, messages go in the order they came.
Weights are what the messages say (the planner writes the tenant's weight on what it publishes for a run).
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class FairSlots(Generic[T]):
    """``arrive`` an item (started now or held), ``done`` when a started one ends (what starts then)."""

    def __init__(self, limit: int, headroom: float = 0.0, yield_share: bool = False) -> None:
        self.limit = max(1, limit)
        self.yield_share = yield_share
        self.ceiling = self.limit + int(headroom * self.limit)  # slots taken at most, past the limit
        self.running: dict[str, int] = {}  # per key, items started and not done
        self.total = 0
        self._waiting: dict[str, deque[T]] = {}  # keys with something held, in the order they became so
        self._pass: dict[str, float] = {}  # each key's service so far, per unit of its weight
        self._weight: dict[str, float] = {}
        self._clock = 0.0  # the pass of the key served last: where a key that arrives starts
        self._held = 0

    def __len__(self) -> int:
        """Items held (not started)."""
        return self._held

    def arrive(self, key: str, item: T, weight: float = 1.0) -> T | None:
        """``item`` of ``key``: returned when it starts now (its slot taken), else held until ``done`` gives it."""
        self._weight[key] = weight if weight > 0 else 1.0
        if key not in self._pass or (key not in self._waiting and not self.running.get(key)):
            self._pass[key] = max(self._pass.get(key, 0.0), self._clock)
        if self.total < self.limit and not self._waiting:
            return self._start(key, item)
        if key not in self._waiting and self.total < self.ceiling and self._below_share(key):
            return self._start(key, item)
        self._waiting.setdefault(key, deque()).append(item)
        self._held += 1
        return None

    def done(self, key: str) -> list[T]:
        """A started item of ``key`` ended: the items that start now, in order (their slots taken)."""
        left = self.running.get(key, 0) - 1
        if left > 0:
            self.running[key] = left
        else:
            self.running.pop(key, None)
        self.total -= 1
        started: list[T] = []
        while self._waiting and self.total < self.limit:
            if self.yield_share and self._yields(self._peek()):
                break
            started.append(self._next())
        self._forget_idle()
        return started

    def drain(self) -> list[T]:
        """Everything held, taken out (in no particular order)."""
        items = [item for queue in self._waiting.values() for item in queue]
        self._waiting.clear()
        self._held = 0
        return items

    def keys(self) -> dict[str, int]:
        """Per key with something held, how many items."""
        return {key: len(queue) for key, queue in self._waiting.items()}

    def others(self, key: str) -> bool:
        """Whether a key other than ``key`` has items running or held."""
        return any(k != key for k in self.running) or any(k != key for k in self._waiting)

    def _below_share(self, key: str) -> bool:
        active = {*self.running, *self._waiting, key}
        weights = sum(self._weight.get(k, 1.0) for k in active)
        return self.running.get(key, 0) < self.limit * self._weight[key] / weights

    def _start(self, key: str, item: T) -> T:
        self.running[key] = self.running.get(key, 0) + 1
        self.total += 1
        self._clock = max(self._clock, self._pass[key])
        self._pass[key] += 1.0 / self._weight[key]
        return item

    def _peek(self) -> str:
        return min(self._waiting, key=lambda k: (self.running.get(k, 0) / self._weight[k], self._pass[k]))

    def _yields(self, key: str) -> bool:
        """Another tenant has messages running here and ``key`` holds its share already: its slot stays free."""
        if not any(k != key for k in self.running):
            return False
        active = {*self.running, *self._waiting}
        weights = sum(self._weight.get(k, 1.0) for k in active)
        return self.running.get(key, 0) >= self.limit * self._weight[key] / weights

    def _next(self) -> T:
        # the held key with the fewest slots per unit of weight; among equals the one served least lately per unit
        # of weight, then the one held longest (dicts keep order)
        key = min(self._waiting, key=lambda k: (self.running.get(k, 0) / self._weight[k], self._pass[k]))
        queue = self._waiting[key]
        item = queue.popleft()
        self._held -= 1
        if not queue:
            del self._waiting[key]
        return self._start(key, item)

    def _forget_idle(self) -> None:
        # An idle key's pass only matters while it is ahead of the clock (it was served beyond its share lately);
        # once the clock passes it, ``arrive`` would start it at the clock anyway. Bounded by the keys seen lately.
        if len(self._pass) <= len(self.running) + len(self._waiting):
            return
        busy = self._waiting.keys() | self.running.keys()
        idle = [k for k, p in self._pass.items() if p <= self._clock and k not in busy]
        for key in idle:
            del self._pass[key]
            self._weight.pop(key, None)
