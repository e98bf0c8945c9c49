"""Time as people read it, shared by the console and the terminal: a step's duration, a deadline's
countdown, a step's bar on the run's time axis (pure)."""

from __future__ import annotations

from datetime import datetime

BAR_UNITS = 1000  # the waterfall's width in SVG user units: x and width scale with the column


def bar(start_s: float, end_s: float | None, span_s: float, now_s: float | None = None) -> tuple[int, int]:
    """A step's bar on the run's time axis: (x, width) in ``BAR_UNITS``; a step still going reaches ``now_s``
    (else the axis' end); an instant (a Decide row) is a thin mark."""
    span = max(span_s, 1e-6)
    end = end_s if end_s is not None else (now_s if now_s is not None else span)
    x = round(min(max(start_s / span, 0.0), 1.0) * BAR_UNITS)
    width = round(min(max((end - start_s) / span, 0.0), 1.0) * BAR_UNITS)
    return min(x, BAR_UNITS - 4), max(4, min(width, BAR_UNITS - x))


def duration(seconds: float | None) -> str:
    """A step's duration as people read it: 850 ms, 2.4 s, 3 m 05 s; an unfinished step: ''."""
    if seconds is None:
        return ""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    return f"{int(seconds // 60)} m {int(seconds % 60):02d} s"


def countdown(deadline: datetime | None, now: datetime) -> str:
    """'in 4 m 05 s' until ``deadline``; 'due now' once it has passed; '' without one."""
    if deadline is None:
        return ""
    left = (deadline - now).total_seconds()
    return "due now" if left <= 0 else f"in {duration(left)}"
