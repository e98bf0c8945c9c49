"""The fleet's admission record (``lw_flow``, key ``fleet``), one per fleet, written under compare-and-swap by
every planner replica (each coalesces its changes into one write): per tenant its runs waiting (counted by
priority: their tickets, in order, are in ``LW_FLOW``) and its runs in flight (admitted, not ended, not waiting
for a person), the planner replicas alive, and what ``loopwarden fleet`` shows of the last minutes (runs ended,
time waited). A submit is counted here, against its tenant's quotas, in the same write that decides it is
accepted, so no two replicas accept past a quota together. Pure: every change is a function of (record, ...,
now) that says whether it changed anything."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, Field

from shared.flow.quotas import Usage, refusal
from shared.flow.rules import Share, pick
from shared.messages import Refusal
from shared.tenancy import Policy

WINDOW_MIN = 5  # minutes of "finished per minute" and "waited" kept


class FleetRecord(BaseModel):
    queued: dict[str, dict[str, int]] = Field(
        default_factory=dict, description="tenant -> priority -> runs waiting (their tickets are in LW_FLOW)"
    )
    running: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="tenant -> run id -> when it was admitted (epoch s)"
    )
    replicas: dict[str, float] = Field(default_factory=dict, description="planner replica -> last seen (epoch s)")
    finished: dict[str, dict[str, int]] = Field(
        default_factory=dict, description="tenant -> minute (epoch min) -> runs of it that ended"
    )
    waited: dict[str, dict[str, list[float]]] = Field(
        default_factory=dict, description="tenant -> minute -> [seconds waited, runs admitted]"
    )
    rate_limited: dict[str, dict[str, list[float]]] = Field(
        default_factory=dict,
        description="tenant -> minute -> [seconds its runs that ended waited for the providers' rate limits, runs]",
    )
    stored: dict[str, int] = Field(default_factory=dict, description="tenant -> bytes its ended runs keep stored")

    def copy_to_change(self) -> FleetRecord:
        """A deep copy, made by hand: every admission round copies the record (its runs in flight by id, hundreds)
        twice, and pydantic's deep copy (``copy.deepcopy``) of it cost more than the rest of the round."""
        return FleetRecord.model_construct(
            queued={t: dict(per) for t, per in self.queued.items()},
            running={t: dict(runs) for t, runs in self.running.items()},
            replicas=dict(self.replicas),
            finished={t: dict(per) for t, per in self.finished.items()},
            waited={t: {m: list(c) for m, c in per.items()} for t, per in self.waited.items()},
            rate_limited={t: {m: list(c) for m, c in per.items()} for t, per in self.rate_limited.items()},
            stored=dict(self.stored),
        )

    def running_of(self, tenant: str) -> int:
        return len(self.running.get(tenant, {}))

    def queued_of(self, tenant: str) -> int:
        return sum(self.queued.get(tenant, {}).values())

    def queued_by(self, tenant: str) -> dict[int, int]:
        return {int(p): n for p, n in self.queued.get(tenant, {}).items() if n > 0}

    @property
    def waiting(self) -> int:
        return sum(self.queued_of(t) for t in self.queued)

    @property
    def total(self) -> int:
        return sum(len(r) for r in self.running.values())

    def tenant_of(self, run_id: str) -> str | None:
        return next((t for t, runs in self.running.items() if run_id in runs), None)


def _minute(now: float) -> str:
    return str(int(now // 60))


def _trim(buckets: dict[str, dict[str, int]] | dict[str, dict[str, list[float]]], now: float) -> None:
    oldest = int(now // 60) - WINDOW_MIN
    for tenant in list(buckets):
        per = buckets[tenant]
        for minute in [m for m in per if int(m) < oldest]:
            del per[minute]
        if not per:
            del buckets[tenant]


def enqueue(record: FleetRecord, policy: Policy, priority: int, outside: Usage) -> Refusal | None:
    """A submit of ``policy.tenant`` at ``priority`` is accepted and counted as waiting, or refused by its quotas:
    its runs waiting and in flight are this record's, the rest (its runs waiting for a person, its open items,
    its spend today) ``outside``'s (``take`` then decides whether it need wait at all)."""
    tenant = policy.tenant
    usage = Usage(
        queued=record.queued_of(tenant),
        running=record.running_of(tenant),
        waiting=outside.waiting,
        human_items=outside.human_items,
        stored_bytes=record.stored.get(tenant, 0),
        spent_usd=outside.spent_usd,
    )
    refused = refusal(policy, usage)
    if refused is None:
        per = record.queued.setdefault(tenant, {})
        per[str(priority)] = per.get(str(priority), 0) + 1
    return refused


def take_at_once(
    record: FleetRecord,
    policy: Policy,
    priority: int,
    run_id: str,
    capacity: int,
    now: float,
    *,
    others: Mapping[str, Policy] | None = None,
    headroom: int = 0,
) -> bool:
    """A submit just counted as waiting (``enqueue``), its tenant's only run waiting, starts at once when the rules
    would pick it next anyway, so it skips the queue (no ticket to publish and take, no record to write twice):

    * no run waits anywhere but it, and the fleet and its tenant have room; or
    * its tenant is ahead of every other tenant with runs waiting (strictly fewer runs in flight per unit of weight)
      and under its cap, and the fleet has room, or the tenant is below its fair share and the headroom has room
      (``rules.pick``): a tenant arriving at a fleet full of another's backlog starts its runs as the next round
      would, without the round. ``others``: the other tenants' policies (weights, caps; default weight 1).

    Otherwise it waits its turn."""
    tenant = policy.tenant
    if record.queued_of(tenant) != 1:
        return False
    if policy.max_running is not None and record.running_of(tenant) >= policy.max_running:
        return False
    if record.waiting == 1 and record.total < capacity:
        return admit(record, tenant, run_id, now, waited_s=0.0, priority=priority)
    shares = []
    for t in {*record.queued, *record.running, tenant}:
        p = policy if t == tenant else (others or {}).get(t)
        weight = p.weight if p is not None else 1.0
        cap = p.max_running if p is not None else None
        shares.append(Share(t, weight, cap, record.running_of(t), record.queued_by(t)))
    if pick(shares, capacity, record.total, headroom) != (tenant, priority):
        return False
    mine = record.running_of(tenant) / policy.weight
    if any(s.tenant != tenant and s.eligible and s.running / s.weight <= mine for s in shares):
        return False  # a tie: the rounds break it (the queue keeps the order it came in)
    return admit(record, tenant, run_id, now, waited_s=0.0, priority=priority)


def dequeue(record: FleetRecord, tenant: str, priority: int) -> bool:
    """One waiting run of ``tenant`` at ``priority`` less (admitted, or counted twice)."""
    per = record.queued.get(tenant, {})
    n = per.get(str(priority), 0)
    if n <= 0:
        return False
    if n == 1:
        del per[str(priority)]
        if not per:
            del record.queued[tenant]
    else:
        per[str(priority)] = n - 1
    return True


def drift(record: FleetRecord, tickets: dict[str, dict[int, int]]) -> dict[tuple[str, int], int]:
    """Where the record's waiting counts differ from the tickets there are: (tenant, priority) -> tickets."""
    keys = {(t, int(p)) for t, per in record.queued.items() for p in per} | {
        (t, p) for t, per in tickets.items() for p in per
    }
    out = {}
    for tenant, priority in keys:
        have = record.queued.get(tenant, {}).get(str(priority), 0)
        there = tickets.get(tenant, {}).get(priority, 0)
        if have != there:
            out[(tenant, priority)] = there
    return out


def recount(record: FleetRecord, counts: dict[tuple[str, int], int]) -> bool:
    """Set waiting counts to what the tickets say (a replica that died between counting a submit and publishing
    its ticket left one too many)."""
    changed = False
    for (tenant, priority), n in counts.items():
        per = record.queued.setdefault(tenant, {})
        if per.get(str(priority), 0) != n:
            changed = True
            if n > 0:
                per[str(priority)] = n
            else:
                per.pop(str(priority), None)
        if not per:
            del record.queued[tenant]
    return changed


def admit(
    record: FleetRecord,
    tenant: str,
    run_id: str,
    now: float,
    waited_s: float | None = None,
    priority: int | None = None,
) -> bool:
    """``run_id`` of ``tenant`` takes a slot (``waited_s``: how long it waited, for the view; ``priority``: it
    waited at that priority, one waiting run less)."""
    runs = record.running.setdefault(tenant, {})
    if run_id in runs:
        return False
    runs[run_id] = now
    if priority is not None:
        dequeue(record, tenant, priority)
    if waited_s is not None:
        cell = record.waited.setdefault(tenant, {}).setdefault(_minute(now), [0.0, 0.0])
        cell[0], cell[1] = round(cell[0] + max(0.0, waited_s), 3), cell[1] + 1
        _trim(record.waited, now)
    return True


def hold(record: FleetRecord, tenant: str, run_id: str, now: float) -> bool:
    """A run that waited for a person goes on: it takes a slot again without queueing (over capacity if need be:
    it was admitted once)."""
    return admit(record, tenant, run_id, now)


def release(
    record: FleetRecord, run_id: str, now: float, *, ended: bool, stored_bytes: int = 0, rate_limited_s: float = 0.0
) -> bool:
    """``run_id`` gives its slot back: it ``ended`` (counted as finished, its ``stored_bytes`` to its tenant, and
    ``rate_limited_s``, the time it waited for the providers' rate limits, to the tenant's minute), or waits for a
    person. A run holding no slot (a sub-agent, a run admitted before flow control) changes nothing
    but what it ended with."""
    tenant = record.tenant_of(run_id)
    if tenant is None:
        return False
    del record.running[tenant][run_id]
    if not record.running[tenant]:
        del record.running[tenant]
    if ended:
        per = record.finished.setdefault(tenant, {})
        per[_minute(now)] = per.get(_minute(now), 0) + 1
        _trim(record.finished, now)
        cell = record.rate_limited.setdefault(tenant, {}).setdefault(_minute(now), [0.0, 0.0])
        cell[0], cell[1] = round(cell[0] + max(0.0, rate_limited_s), 3), cell[1] + 1
        _trim(record.rate_limited, now)
        if stored_bytes:
            record.stored[tenant] = record.stored.get(tenant, 0) + stored_bytes
    return True


def forget_stored(record: FleetRecord, tenant: str, stored_bytes: int) -> bool:
    """Retention removed a run of ``tenant`` that kept ``stored_bytes``."""
    if not stored_bytes or tenant not in record.stored:
        return False
    record.stored[tenant] = max(0, record.stored[tenant] - stored_bytes)
    return True


def heartbeat(record: FleetRecord, replica: str, now: float, ttl: float) -> bool:
    """``replica`` is alive now; replicas not seen for ``ttl`` seconds are dropped. Changes the record only when
    a replica comes or goes or its mark is older than a third of ``ttl`` (so a write is not made for it alone)."""
    changed = False
    for other in [r for r, seen in record.replicas.items() if now - seen > ttl]:
        del record.replicas[other]
        changed = True
    if now - record.replicas.get(replica, 0.0) > ttl / 3:
        record.replicas[replica] = now
        changed = True
    return changed


def live_planners(record: FleetRecord, now: float, ttl: float) -> int:
    return sum(1 for seen in record.replicas.values() if now - seen <= ttl)
