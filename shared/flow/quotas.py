"""What a submit is refused against (pure): a tenant's quotas and its daily cost ceiling, checked at the door.

A submit past one is refused at once with a typed ``Refusal`` naming the quota, its limit and the tenant's
current figure; nothing it would have started is, and nothing already accepted is dropped. The figures are
the fleet's as the planner last read them (``Usage``): submits taken at the same moment by several replicas
may pass a quota by at most what they take at once (docs/flow-control.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.messages import Refusal
from shared.tenancy import Policy


@dataclass(frozen=True)
class Usage:
    """A tenant's figures when its submit arrives."""

    queued: int = 0
    running: int = 0
    waiting: int = 0  # runs waiting for a person: its open items in the human queue
    human_items: int = 0
    stored_bytes: int = 0
    spent_usd: float = 0.0

    @property
    def runs(self) -> int:
        return self.queued + self.running + self.waiting


def refusal(policy: Policy, usage: Usage) -> Refusal | None:
    """Why ``policy.tenant``'s new run is refused (None: it is accepted). A quota is passed when the new run would
    go over it: ``max_runs`` counts the runs queued, running and waiting for a person; ``max_human_items`` its
    open items in the human queue (a new run may raise more); ``max_stored_bytes`` what its ended runs keep
    stored; the daily ceiling what its runs spent since 00:00 UTC."""
    t = policy.tenant
    ceiling = policy.daily_ceiling_usd
    if ceiling is not None and usage.spent_usd >= ceiling:
        return Refusal(
            quota="daily_ceiling_usd",
            limit=ceiling,
            current=round(usage.spent_usd, 6),
            reason=f"tenant {t} reached its daily cost ceiling: spent ${usage.spent_usd:.4f} of ${ceiling:g} today "
            "(UTC); new runs are refused until 00:00 UTC or a higher ceiling",
        )
    if policy.max_runs is not None and usage.runs >= policy.max_runs:
        return Refusal(
            quota="max_runs",
            limit=policy.max_runs,
            current=usage.runs,
            reason=f"tenant {t} has {usage.runs} runs queued, running or waiting for a person ({usage.queued} queued, "
            f"{usage.running} running, {usage.waiting} waiting): its quota is {policy.max_runs}; submit again once "
            "some have ended",
        )
    if policy.max_human_items is not None and usage.human_items >= policy.max_human_items:
        return Refusal(
            quota="max_human_items",
            limit=policy.max_human_items,
            current=usage.human_items,
            reason=f"tenant {t} has {usage.human_items} open items in the human queue: its quota is "
            f"{policy.max_human_items}; new runs are refused until people resolve some",
        )
    if policy.max_stored_bytes is not None and usage.stored_bytes >= policy.max_stored_bytes:
        return Refusal(
            quota="max_stored_bytes",
            limit=policy.max_stored_bytes,
            current=usage.stored_bytes,
            reason=f"tenant {t}'s runs keep {usage.stored_bytes} bytes stored: its quota is {policy.max_stored_bytes}; "
            "new runs are refused until retention removes ended runs (`loopwarden retention`)",
        )
    return None


def submit_stream_refusal(description: str, limit: float | None, current: float | None) -> Refusal:
    """The submit stream is full (JetStream refused the publish: ``maximum messages/bytes exceeded``): the submit
    was not stored, so nothing of it can start."""
    what = "bytes" if "bytes" in description else "messages"
    return Refusal(
        quota="submit_stream",
        limit=limit,
        current=current,
        reason=f"the submit stream (LW_SUBMIT) is full ({description}: {what} limit "
        f"{'unknown' if limit is None else f'{limit:g}'}); the submit was not stored - submit again later "
        "(operators: `loopwarden retention` purges handled submits; LW_STREAM_MAX_MSGS/LW_STREAM_MAX_BYTES)",
    )
