"""What flow control reads, for admission, the quotas at the door and the fleet's view: the fleet's record, the
waiting runs' counts (the tickets' subjects), each tenant's open items in the human queue and its day of spend;
each read shared by the callers that wait for it (``Fresh``). And the figures as metrics."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from opentelemetry.metrics import CallbackOptions, Observation

from shared import metrics as M
from shared import subjects as S
from shared.bus import Bus, Stored, scan_page
from shared.flow import (
    FleetRecord,
    Policies,
    TenantDay,
    Usage,
    capacity_of,
    day_key,
    fleet_view,
    live_planners,
    today,
)
from shared.flow.view import quota_use
from shared.live_config import LiveConfig
from shared.messages import FleetView, FlowTicket, OpenItems
from shared.ratelimit.fleet import provider_keys
from shared.settings import Settings
from shared.telemetry import Telemetry
from shared.tenancy import Policy

FLEET_KEY = "fleet"
OPEN_KEY = "open"
T = TypeVar("T")


class Fresh(Generic[T]):
    """A read shared by the callers that wait for it, and always begun after each of them asked: a caller that
    arrives while a read is under way waits for the next one (so it sees what happened before it asked), and
    every caller arriving meanwhile shares that next one."""

    def __init__(self, read: Callable[[], Awaitable[T]]) -> None:
        self.read = read
        self._next: asyncio.Future[T] | None = None
        self._reading: asyncio.Task[None] | None = None

    async def get(self) -> T:
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
        fut = self._next
        if self._reading is None or self._reading.done():
            self._reading = asyncio.create_task(self._run())
        return await asyncio.shield(fut)

    async def _run(self) -> None:
        while self._next is not None:
            fut, self._next = self._next, None
            try:
                fut.set_result(await self.read())
            except Exception as err:
                fut.set_exception(err)
                fut.exception()  # retrieved here: every waiter gets it raised


class FlowReads:
    """The reads (and metrics) ``Flow`` stands on."""

    def __init__(self, bus: Bus, settings: Settings, telemetry: Telemetry) -> None:
        self.bus, self.settings = bus, settings
        self.policies = Policies(settings, LiveConfig(bus).policies)
        self._kept: tuple[FleetRecord, int] | None = None
        self._records = Fresh(self._read_record)
        self._open = Fresh(self._read_open)
        self._days: dict[str, Fresh[float]] = {}
        self.last_usage: dict[str, tuple[Policy, Usage]] = {}
        meter = telemetry.meter("loopwarden.planner")
        self.tenant_label = M.Bounded()  # a tenant label's values, bounded (docs/observability.md)
        meter.create_observable_gauge(M.FLOW_QUEUED, callbacks=[self._gauge_queued])
        meter.create_observable_gauge(M.FLOW_RUNNING, callbacks=[self._gauge_running])
        meter.create_observable_gauge(M.FLOW_CAPACITY, callbacks=[self._gauge_capacity])
        meter.create_observable_gauge(M.FLOW_QUOTA_USED, callbacks=[self._gauge_quota_used])
        meter.create_observable_gauge(M.FLOW_QUOTA_LIMIT, callbacks=[self._gauge_quota_limit])

    @property
    def ttl(self) -> float:
        """A planner replica not seen for this long is not counted alive (three sweeps)."""
        return 3 * self.settings.flow_sweep_s

    def capacity(self, record: FleetRecord, now: float) -> int:
        per = self.settings.flow_runs_per_planner or 2 * self.settings.in_flight_for("planner")
        return capacity_of(self.settings.flow_capacity, live_planners(record, now, self.ttl), per)

    # --- reads -----------------------------------------------------------------------------------------------
    def _keep(self, record: FleetRecord | None, revision: int) -> None:
        self._kept = (record, revision) if record is not None else None

    async def _read_record(self) -> FleetRecord:
        record, revision = await self.bus.kv_get(S.KV_FLOW, FLEET_KEY, FleetRecord)
        self._keep(record, revision)
        return record or FleetRecord()

    async def _read_counts(self) -> dict[str, dict[int, int]]:
        """Waiting runs per tenant and priority: the number of tickets on each subject (one stream info)."""
        counts: dict[str, dict[int, int]] = {}
        prefix = S.FLOW_TICKET_PREFIX + "."
        offset = 0
        while True:
            request = json.dumps({"subjects_filter": f"{prefix}>", "offset": offset}).encode()
            reply = await self.bus.nc.request(f"$JS.API.STREAM.INFO.{S.STREAM_FLOW}", request, timeout=5)
            info = json.loads(reply.data)
            if "error" in info:
                raise RuntimeError(f"{S.STREAM_FLOW}: {info['error'].get('description')}")
            page = (info.get("state") or {}).get("subjects") or {}
            for subject, n in page.items():
                tenant, _, priority = subject[len(prefix) :].rpartition(".")
                counts.setdefault(tenant, {})[int(priority)] = int(n)
            offset += len(page)
            if not page or offset >= int(info.get("total") or 0):
                return counts

    async def _read_open(self) -> dict[str, int]:
        """Each tenant's open items in the human queue, as the escalation service last wrote them."""
        stored, _ = await self.bus.kv_get(S.KV_HUMAN_COUNTS, OPEN_KEY, OpenItems)
        return stored.counts if stored is not None else {}

    async def spent(self, tenant: str) -> float:
        """What ``tenant``'s runs spent today (UTC), as the governor keeps it."""

        async def read() -> float:
            day, _ = await self.bus.kv_get(S.KV_BUDGETS, day_key(tenant, today()), TenantDay)
            return day.spent_usd if day is not None else 0.0

        fresh = self._days.get(tenant)
        if fresh is None:
            fresh = self._days[tenant] = Fresh(read)
            if len(self._days) > 4096:
                self._days.pop(next(iter(self._days)))
        return await fresh.get()

    async def outside(self, tenant: str, policy: Policy) -> Usage:
        """``tenant``'s figures the fleet's record does not hold, for its quotas: its runs waiting for a person
        (its open items in the human queue) and, when it has a ceiling, its spend today (each read begun after
        this call; concurrent calls share it)."""
        open_items = await self._open.get()
        return Usage(
            waiting=open_items.get(tenant, 0),
            human_items=open_items.get(tenant, 0),
            spent_usd=await self.spent(tenant) if policy.daily_ceiling_usd is not None else 0.0,
        )

    def note_usage(self, policy: Policy, record: FleetRecord, outside: Usage) -> None:
        """Keep the tenant's figures for the quota metrics."""
        t = policy.tenant
        self.last_usage[t] = (
            policy,
            Usage(
                queued=record.queued_of(t),
                running=record.running_of(t),
                waiting=outside.waiting,
                human_items=outside.human_items,
                stored_bytes=record.stored.get(t, 0),
                spent_usd=outside.spent_usd,
            ),
        )
        if len(self.last_usage) > 1024:
            self.last_usage.pop(next(iter(self.last_usage)))

    # --- the view --------------------------------------------------------------------------------------------
    async def view(self, tenant: str | None = None) -> FleetView:
        record, open_items = await asyncio.gather(self._records.get(), self._open.get())
        named = set(await self.policies.tenants())
        names = (
            {tenant}
            if tenant is not None
            else named | set(record.running) | set(record.queued) | set(open_items) | set(record.stored)
        )
        policies = {t: await self.policies.of(t) for t in names}
        spent = {t: await self.spent(t) for t in names}
        oldest = {}
        for t in names:
            heads = [await self._oldest(t, p) for p in record.queued_by(t)]
            stamps = [h for h in heads if h is not None]
            if stamps:
                oldest[t] = min(stamps)
        now = time.time()
        keys = await provider_keys(self.bus, self.settings, now)
        view = fleet_view(
            record,
            oldest,
            policies,
            {t: open_items.get(t, 0) for t in names},
            spent,
            now=now,
            capacity=self.capacity(record, now),
            planners=live_planners(record, now, self.ttl),
        )
        view.providers = [key.model_dump(mode="json") for key in keys]
        return view

    async def _oldest(self, tenant: str, priority: int) -> float | None:
        msgs, _ = await scan_page(self.bus.nc, S.STREAM_FLOW, S.flow_ticket(tenant, priority), batch=1)
        ticket = ticket_of(msgs[0]) if msgs else None
        return ticket[0].queued_at.timestamp() if ticket is not None else None

    # --- metrics (fleet-wide figures: every planner replica reports the same; take one, not the sum) -----------
    def _gauge_queued(self, options: CallbackOptions) -> list[Observation]:
        record = self._kept[0] if self._kept is not None else FleetRecord()
        return [Observation(record.queued_of(t), {"tenant": self.tenant_label(t)}) for t in record.queued]

    def _gauge_running(self, options: CallbackOptions) -> list[Observation]:
        record = self._kept[0] if self._kept is not None else FleetRecord()
        return [Observation(len(runs), {"tenant": self.tenant_label(t)}) for t, runs in record.running.items()]

    def _gauge_capacity(self, options: CallbackOptions) -> list[Observation]:
        record = self._kept[0] if self._kept is not None else FleetRecord()
        return [Observation(self.capacity(record, time.time()))]

    def _gauge_quota_used(self, options: CallbackOptions) -> list[Observation]:
        return [
            Observation(q.current, {"tenant": self.tenant_label(t), "quota": q.quota})
            for t, (policy, usage) in self.last_usage.items()
            for q in quota_use(policy, usage)
        ]

    def _gauge_quota_limit(self, options: CallbackOptions) -> list[Observation]:
        return [
            Observation(q.limit, {"tenant": self.tenant_label(t), "quota": q.quota})
            for t, (policy, usage) in self.last_usage.items()
            for q in quota_use(policy, usage)
            if q.limit is not None
        ]


def ticket_of(msg: Stored) -> tuple[FlowTicket, int] | None:
    try:
        return FlowTicket.model_validate_json(msg.data), msg.seq
    except ValueError:
        return None
