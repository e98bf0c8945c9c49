"""What a planner's periodic sweep does with a run the fleet's record says is in flight (pure): the record is
written by replicas that may die between two of their steps, so each replica checks now and then that every
slot is held by a run that still needs it."""

from __future__ import annotations

from typing import Literal

Check = Literal["keep", "release", "start"]


def due(
    running: dict[str, float], checked: dict[str, float], now: float, *, grace: float, every: float, batch: int
) -> list[str]:
    """The runs to look at now: admitted at least ``grace`` ago (a start in progress is left alone), not looked at
    by this replica in the last ``every`` seconds, the longest unchecked first, at most ``batch``."""
    ready = [r for r, at in running.items() if now - at >= grace and now - checked.get(r, 0.0) >= every]
    ready.sort(key=lambda r: checked.get(r, 0.0))
    return ready[:batch]


def verdict(status: str | None) -> Check:
    """What a slot's run needs, by its stored status (None: no record): a run that ended, waits for a person or
    is gone gives its slot back; one still ``queued`` was admitted by a replica that died before starting it,
    so it is started here; a running one keeps it."""
    if status == "running":
        return "keep"
    if status == "queued":
        return "start"
    return "release"
