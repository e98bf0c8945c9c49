"""Who is admitted when runs wait (weighted fair share, pure).

The fleet admits at most ``capacity`` runs at once, every tenant together; each tenant at most its
``max_running``. When a slot is free and runs wait, it goes to the tenant with the fewest runs in flight per
unit of weight among the tenants that have runs waiting and are under their cap (ties: the one whose oldest
waiting run waited longest, then by name); within that tenant, to its highest priority, oldest first (the
ticket order). Work-conserving: a tenant alone may fill the fleet. A run's sub-agents are never queued (their
parent holds the slot) and a run waiting for a person holds none.

A tenant that arrives at a full fleet is owed its share of it, but slots free only as the runs in flight end. So
a tenant below its share (``capacity`` x its weight / the weights of the tenants with runs in flight or waiting)
may start runs past the capacity, by at most ``headroom`` runs in all: it does not wait for a backlog's runs to end
to get its first ones in. The fleet is back under its capacity as those end (the tenants over their share start
nothing until then).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class Share:
    """One tenant as the scheduler sees it."""

    tenant: str
    weight: float = 1.0
    cap: int | None = None  # its max_running (None: no cap of its own)
    running: int = 0
    queued: dict[int, int] = field(default_factory=dict)  # priority -> runs waiting
    since: float = 0.0  # when its oldest waiting run was queued (epoch seconds; 0: unknown)

    @property
    def waiting(self) -> int:
        return sum(n for n in self.queued.values() if n > 0)

    @property
    def eligible(self) -> bool:
        return self.waiting > 0 and (self.cap is None or self.running < self.cap)

    @property
    def top(self) -> int:
        """Its highest priority with a run waiting."""
        return max(p for p, n in self.queued.items() if n > 0)


def capacity_of(setting: int | None, live_planners: int, per_planner: int) -> int:
    """Runs the fleet has in flight at once: the setting, else ``per_planner`` for each live planner (at least one:
    a planner that admits is alive)."""
    return setting if setting is not None else per_planner * max(1, live_planners)


def fair_share(share: Share, shares: list[Share], capacity: int) -> float:
    """``share``'s part of the capacity among the tenants with runs in flight or waiting, by weight."""
    active = sum(s.weight for s in shares if s.running or s.waiting)
    return capacity * share.weight / active if active else float(capacity)


def pick(
    shares: Iterable[Share], capacity: int, running: int | None = None, headroom: int = 0
) -> tuple[str, int] | None:
    """The (tenant, priority) the next free slot goes to, or None: the fleet is full (``running`` of
    ``capacity``; default: the shares' sum) or no tenant under its cap has a run waiting. Past the capacity, by
    at most ``headroom`` runs, only a tenant below its fair share is admitted."""
    shares = list(shares)
    total = sum(s.running for s in shares) if running is None else running
    if total >= capacity + headroom:
        return None
    eligible = [s for s in shares if s.eligible]
    if total >= capacity:
        eligible = [s for s in eligible if s.running < fair_share(s, shares, capacity)]
    if not eligible:
        return None
    best = min(eligible, key=lambda s: (s.running / s.weight, s.since or float("inf"), s.tenant))
    return best.tenant, best.top


def plan(
    shares: Iterable[Share], capacity: int, limit: int, running: int | None = None, headroom: int = 0
) -> list[tuple[str, int]]:
    """Up to ``limit`` picks in a row, each counted as admitted before the next (``pick`` again and again)."""
    by_tenant = {s.tenant: s for s in shares}
    total = sum(s.running for s in by_tenant.values()) if running is None else running
    out: list[tuple[str, int]] = []
    while len(out) < limit:
        chosen = pick(by_tenant.values(), capacity, total, headroom)
        if chosen is None:
            break
        tenant, priority = chosen
        s = by_tenant[tenant]
        by_tenant[tenant] = replace(s, running=s.running + 1, queued={**s.queued, priority: s.queued[priority] - 1})
        total += 1
        out.append(chosen)
    return out
