"""What a person sees of the providers' rate limits, fleet-wide: per provider key, the limits learned or
set, what the provider last said is left, and how long a call sent now would wait. Read from the shared
records (``lw_ratelimits``); ``loopwarden fleet`` and the console's fleet page show it."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from shared import subjects as S
from shared.messages import AnyRunEvent, Judged, ModelCalled, ModelStopped, RateLimited, RunFinished
from shared.ratelimit.bucket import KeyRecord, KeyView, view

if TYPE_CHECKING:
    from shared.bus import Bus
    from shared.settings import Settings


async def provider_keys(bus: Bus, settings: Settings, now: float | None = None) -> list[KeyView]:
    """Every provider key the fleet's model calls have used, as a person sees it (sorted by provider, key)."""
    records = await bus.kv_values(S.KV_RATE_LIMITS, KeyRecord)
    at = time.time() if now is None else now
    views = [
        view(r, settings.rate_limit_for(r.provider, r.account), at, settings.rate_limit_burst_s)
        for r in records.values()
    ]
    return sorted(views, key=lambda v: (v.provider, v.account))


def describe(key: KeyView) -> list[str]:
    """A key in a few lines of text (``loopwarden fleet``)."""
    head = f"{key.provider} key {key.account}"
    if key.headerless and not key.dimensions:
        return [f"{head}: the provider announces no rate limit (none set): not limited"]
    if not key.dimensions:
        return [f"{head}: limits not known yet"]
    lines = [head + ":"]
    for dim, d in key.dimensions.items():
        left = "" if d.remaining is None else f", {d.remaining:,.0f} left"
        if d.reset_at is not None and d.remaining is not None:
            left += f" (full at {datetime.fromtimestamp(d.reset_at, UTC):%H:%M:%S} UTC)"
        lines.append(f"  {dim:<14} {d.limit_per_minute:>12,.0f}/min ({d.source}){left}")
    wait = "none" if key.wait_s <= 0 else f"{key.wait_s:.1f}s"
    if key.paused_s > 0:
        wait += f" (paused by a 429 for {key.paused_s:.1f}s)"
    lines.append(f"  wait now       {wait}; 429s so far {key.rejections}; input estimate x{key.calibration:.2f}")
    return lines


def current_wait(events: Sequence[AnyRunEvent], now: datetime) -> RateLimited | None:
    """The wait for a rate limit a run is in now: its latest ``run.rate_limited`` event, unless its time
    has passed or what it held has happened since (the turn's answer, the verdict, the run's end)."""
    for ev in reversed(events):
        if isinstance(ev, RateLimited):
            return ev if ev.detail.until > now else None
        if isinstance(ev, ModelCalled | ModelStopped | Judged | RunFinished):
            return None  # the call it held went (a turn's answer, a verdict), or the run ended
    return None
