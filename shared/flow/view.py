"""The fleet as ``loopwarden fleet`` and the console's /fleet page show it (pure): per tenant what waits, what
runs, what ended per minute, how long its runs waited for their share, and each quota's use."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime

from shared.flow.fleet import WINDOW_MIN, FleetRecord
from shared.flow.quotas import Usage
from shared.messages import FleetView, QuotaUse, TenantFlow
from shared.tenancy import Policy


def quota_use(policy: Policy, usage: Usage) -> list[QuotaUse]:
    return [
        QuotaUse(quota="max_runs", limit=policy.max_runs, current=usage.runs),
        QuotaUse(quota="max_human_items", limit=policy.max_human_items, current=usage.human_items),
        QuotaUse(quota="max_stored_bytes", limit=policy.max_stored_bytes, current=usage.stored_bytes),
        QuotaUse(quota="daily_ceiling_usd", limit=policy.daily_ceiling_usd, current=round(usage.spent_usd, 6)),
    ]


def fleet_view(
    record: FleetRecord,
    oldest: Mapping[str, float],
    policies: Mapping[str, Policy],
    open_items: Mapping[str, int],
    spent: Mapping[str, float],
    *,
    now: float,
    capacity: int,
    planners: int,
) -> FleetView:
    """Every tenant any of the figures names (``policies`` must have each of them)."""
    window_start = int(now // 60) - WINDOW_MIN + 1  # the current minute and the ones before it
    minutes = max(1.0, (now - window_start * 60) / 60)
    rows = []
    for tenant in sorted(policies):
        policy = policies[tenant]
        waiting_by = record.queued_by(tenant)
        usage = Usage(
            queued=sum(waiting_by.values()),
            running=record.running_of(tenant),
            waiting=open_items.get(tenant, 0),
            human_items=open_items.get(tenant, 0),
            stored_bytes=record.stored.get(tenant, 0),
            spent_usd=spent.get(tenant, 0.0),
        )
        ended = sum(n for m, n in record.finished.get(tenant, {}).items() if int(m) >= window_start)
        cells = [c for m, c in record.waited.get(tenant, {}).items() if int(m) >= window_start]
        admitted = sum(c[1] for c in cells)
        limited = [c for m, c in record.rate_limited.get(tenant, {}).items() if int(m) >= window_start]
        limited_runs = sum(c[1] for c in limited)
        rows.append(
            TenantFlow(
                tenant=tenant,
                weight=policy.weight,
                max_running=policy.max_running,
                queued=usage.queued,
                queued_by_priority={str(p): n for p, n in sorted(waiting_by.items(), reverse=True)},
                running=usage.running,
                waiting_for_people=usage.waiting,
                finished_per_min=round(ended / minutes, 2),
                waited_s=round(sum(c[0] for c in cells) / admitted, 3) if admitted else 0.0,
                oldest_wait_s=round(max(0.0, now - oldest[tenant]), 3) if tenant in oldest else 0.0,
                rate_limited_s=round(sum(c[0] for c in limited) / limited_runs, 3) if limited_runs else 0.0,
                quotas=quota_use(policy, usage),
            )
        )
    return FleetView(
        at=datetime.fromtimestamp(now, UTC),
        capacity=capacity,
        running=record.total,
        queued=sum(r.queued for r in rows),
        planners=planners,
        window_s=round(minutes * 60, 1),
        tenants=rows,
    )
