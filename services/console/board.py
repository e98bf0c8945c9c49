"""What the console shows, computed from what the bus holds (pure: no bus, no HTTP).

A run's row comes from its record in ``lw_runs`` (read as plain JSON, so a record of a newer
or older planner, or a broken one, still shows what it can); its timeline comes from the
events published for it; its trace id from the W3C ``traceparent`` its messages carry.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shared import subjects as S

MAX_EVENTS_PER_RUN = 300


@dataclass
class RunRow:
    run_id: str
    status: str
    task: str
    cost_usd: float
    input_tokens: int
    output_tokens: int
    iterations: int
    model_calls: int
    updated_at: str
    final_output: str | None
    final_reason: str | None
    awaiting: dict[str, Any] | None
    readable: bool = True


def run_row(key: str, raw: bytes | None) -> RunRow:
    """A run's summary from its stored record; an unreadable record is a row that says so."""
    try:
        data = json.loads(raw or b"")
        if not isinstance(data, dict):
            raise ValueError("not an object")
    except ValueError as err:
        note = f"(record does not parse: {err})"
        return RunRow(key, "unreadable", note, 0.0, 0, 0, 0, 0, "", None, None, None, readable=False)
    usage = data.get("usage") or {}
    iteration = data.get("iteration") or {}
    return RunRow(
        run_id=str(data.get("run_id") or key),
        status=str(data.get("status") or "?"),
        task=str(data.get("task") or ""),
        cost_usd=float(usage.get("cost_usd") or 0.0),
        input_tokens=int(usage.get("input_tokens") or 0),
        output_tokens=int(usage.get("output_tokens") or 0),
        iterations=int(iteration.get("n") or 0),
        model_calls=int(data.get("model_calls") or 0),
        updated_at=str(data.get("updated_at") or ""),
        final_output=data.get("final_output"),
        final_reason=data.get("final_reason"),
        awaiting=data.get("awaiting"),
    )


@dataclass
class TimelineEntry:
    seq: int
    at: str
    kind: str
    summary: str


@dataclass
class RunTimeline:
    trace_id: str | None = None
    entries: list[TimelineEntry] = field(default_factory=list)


def trace_id_of(traceparent: str | None) -> str | None:
    """The trace id of a W3C ``traceparent`` (``00-<32 hex>-<16 hex>-<2 hex>``)."""
    parts = (traceparent or "").split("-")
    if len(parts) == 4 and len(parts[1]) == 32 and parts[1] != "0" * 32:
        return parts[1]
    return None


def timeline_entry(seq: int, subject: str, body: bytes, at: datetime | None) -> TimelineEntry:
    kind = S.stem(subject).removeprefix(f"{S.P}.evt.")
    try:
        data = json.loads(body)
    except ValueError:
        data = {}
    data = data if isinstance(data, dict) else {}
    summary = ""
    for key in ("summary", "reason", "error", "note", "action"):
        value = data.get(key)
        if isinstance(value, str) and value:
            summary = value
            break
    if kind.startswith("tool.succeeded."):  # the validator's outcome: no summary field of its own
        how = [w for w, on in (("repaired", data.get("repaired")), ("from cache", data.get("cached"))) if on]
        summary = "validated" + (f" ({', '.join(how)})" if how else "")
    if kind.startswith("escalation.") and data.get("operator"):
        via = f" via {data['via']}" if data.get("via") else ""
        summary = f"{data['operator']}{via}: {summary}".rstrip(": ")
    if kind == "escalation.resolved":
        via = f" via {data['via']}" if data.get("via") else ""
        by = "the SLA" if data.get("by_sla") else data.get("resolved_by", "?")
        summary = f"{data.get('action')} by {by}{via}" + (f": {data['note']}" if data.get("note") else "")
    return TimelineEntry(seq=seq, at=at.strftime("%H:%M:%S") if at else "", kind=kind, summary=summary[:300])


def add_event(timeline: RunTimeline, entry: TimelineEntry, traceparent: str | None) -> None:
    if timeline.trace_id is None:
        timeline.trace_id = trace_id_of(traceparent)
    timeline.entries.append(entry)
    del timeline.entries[:-MAX_EVENTS_PER_RUN]


def jaeger_link(jaeger_url: str, trace_id: str | None) -> str | None:
    return f"{jaeger_url.rstrip('/')}/trace/{trace_id}" if trace_id else None


def parse_age(value: str | None) -> float | None:
    """'90', '90s', '5m', '2h' -> seconds; empty -> None; anything else is a ValueError naming it."""
    if value is None or not value.strip():
        return None
    text = value.strip().lower()
    scale = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}.get(text[-1])
    number = text[:-1] if scale else text
    try:
        seconds = float(number) * (scale or 1.0)
    except ValueError:
        raise ValueError(f"age {value!r}: use seconds or 30s / 5m / 2h / 1d") from None
    if seconds < 0:
        raise ValueError(f"age {value!r} is negative")
    return seconds
