"""``loopwarden fleet``: the fleet as flow control sees it - per tenant what waits, what runs, what ended per
minute, how long its runs waited for their share and for the providers' rate limits, and each quota's use; per
provider key the limits learned or set, what is left and the wait now (docs/flow-control.md, docs/rate-limits.md)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from loopwarden.cli_common import OK, add_json_flag, connected, emit_json, say

if TYPE_CHECKING:
    from shared.messages import FleetView, QuotaUse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "fleet",
        help="per tenant: runs queued, running, finished per minute, time waited for fair share and rate limits, "
        "quota use; per provider key: its limits, what is left, the wait",
        description="The fleet as flow control sees it, asked of a planner: the fleet's capacity (runs in flight at "
        "once) and live planners; per tenant its runs queued (by priority), running and waiting for a person, "
        "finished per minute, the mean time its runs admitted lately waited for their share and its oldest waiting "
        "run's wait so far, the mean time its runs that ended lately waited for the providers' rate limits, and each "
        "quota's use (docs/flow-control.md); per provider key (account hashed) the limits learned from its headers or "
        "set, what the provider last said is left, and how long a call sent now would wait (docs/rate-limits.md). A "
        "tenant-bound client sees its own tenant.",
    )
    add_json_flag(p)
    p.set_defaults(func=cmd_fleet)


def quota_text(q: QuotaUse) -> str:
    if q.quota == "daily_ceiling_usd":
        used = f"${q.current:.4f}"
        return f"spent {used}" + (f"/${q.limit:g}" if q.limit is not None else " (no ceiling)")
    name = {"max_runs": "runs", "max_human_items": "human items", "max_stored_bytes": "stored"}[q.quota]
    return f"{name} {q.current:g}" + (f"/{q.limit:g}" if q.limit is not None else "")


def render(view: FleetView) -> list[str]:
    from shared.ratelimit.bucket import KeyView
    from shared.ratelimit.fleet import describe

    lines = [
        f"fleet: {view.running} of {view.capacity} runs in flight, {view.queued} queued, {view.planners} planner(s) "
        f"alive (rates over the last {view.window_s / 60:.0f} min)",
        f"{'tenant':<16} {'weight':>6} {'cap':>5} {'queued':>7} {'running':>8} {'people':>7} {'done/min':>9} "
        f"{'waited':>8} {'oldest':>8} {'ratelim':>8}  quotas",
    ]
    for t in view.tenants:
        cap = "-" if t.max_running is None else str(t.max_running)
        quotas = ", ".join(quota_text(q) for q in t.quotas)
        lines.append(
            f"{t.tenant:<16} {t.weight:>6g} {cap:>5} {t.queued:>7} {t.running:>8} {t.waiting_for_people:>7} "
            f"{t.finished_per_min:>9.1f} {t.waited_s:>7.1f}s {t.oldest_wait_s:>7.1f}s {t.rate_limited_s:>7.1f}s  "
            f"{quotas}"
        )
        if t.queued_by_priority:
            by = ", ".join(f"p{p}: {n}" for p, n in t.queued_by_priority.items())
            lines.append(f"{'':<16} queued by priority: {by}")
    if not view.tenants:
        lines.append("(no tenant has runs, quotas or a policy yet)")
    lines.append("providers:" if view.providers else "providers: (no model call has used a key yet)")
    for key in view.providers:
        lines += ["  " + line for line in describe(KeyView.model_validate(key))]
    return lines


async def cmd_fleet(args: argparse.Namespace) -> int:
    async with connected() as client:
        view = await client.fleet()
    if args.json:
        emit_json(view.model_dump(mode="json"))
        return OK
    for line in render(view):
        say(line)
    return OK
