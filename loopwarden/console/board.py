"""What the console shows, computed from what the bus holds (pure: no bus, no HTTP).

A run's row comes from its record in ``lw_runs`` (read as plain JSON, so a record of a newer
or older planner, or a broken one, still shows what it can); its timeline comes from the
events published for it; its trace id from the W3C ``traceparent`` its messages carry.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shared import subjects as S
from shared.failures import FailureType, parse_failure_type

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
    tenant: str = ""
    tools: tuple[str, ...] = ()
    updated_ts: float = 0.0
    agent: str = ""  # seconds since the epoch, for the age filters and the order


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
    config = data.get("config") or {}
    tools = tuple(dict.fromkeys(str(t[0]) for t in data.get("tool_history") or [] if isinstance(t, list) and t))
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
        tenant=str(data.get("tenant") or (config.get("tenant") if isinstance(config, dict) else None) or ""),
        tools=tools,
        updated_ts=_epoch(data.get("updated_at")),
        agent=str(data.get("agent") or ""),
    )


def _epoch(value: Any) -> float:
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


# --- the runs list: filters and pages ------------------------------------------------------------------

RUN_STATUSES = ("queued", "running", "awaiting_human", "stalled", "completed", "stopped", "failed", "refused")
PER_PAGE = 50


@dataclass(frozen=True)
class RunFilter:
    """What the runs list is narrowed to; every field empty: every run."""

    status: str = ""
    agent: str = ""
    tenant: str = ""
    tool: str = ""
    failure: FailureType | None = None  # a failure type one of the run's tool calls had (output_invalid, ...)
    q: str = ""  # in the run id or the task
    newer_than_s: float | None = None
    older_than_s: float | None = None
    min_cost_usd: float | None = None

    @classmethod
    def from_query(cls, q: Mapping[str, str]) -> RunFilter:
        """The filter of a query string; a value that does not parse is a ValueError naming it."""
        cost = q.get("min_cost", "").strip().lstrip("$")
        try:
            min_cost = float(cost) if cost else None
        except ValueError:
            raise ValueError(f"cost {q.get('min_cost')!r}: a number of dollars, e.g. 0.01") from None
        return cls(
            status=q.get("status", "").strip(),
            agent=q.get("agent", "").strip(),
            tenant=q.get("tenant", "").strip(),
            tool=q.get("tool", "").strip(),
            failure=parse_failure_type(failure) if (failure := q.get("failure", "").strip()) else None,
            q=q.get("q", "").strip(),
            newer_than_s=parse_age(q.get("newer_than")),
            older_than_s=parse_age(q.get("older_than")),
            min_cost_usd=min_cost,
        )

    def matches(self, row: RunRow, failures: Mapping[str, set[FailureType]], now: float) -> bool:
        if self.status and row.status != self.status:
            return False
        if self.agent and row.agent != self.agent:
            return False
        if self.tenant and row.tenant != self.tenant:
            return False
        if self.tool and self.tool not in row.tools:
            return False
        if self.failure and self.failure not in failures.get(row.run_id, ()):
            return False
        if self.q and self.q.lower() not in row.run_id.lower() and self.q.lower() not in row.task.lower():
            return False
        if self.newer_than_s is not None and now - row.updated_ts > self.newer_than_s:
            return False
        if self.older_than_s is not None and now - row.updated_ts < self.older_than_s:
            return False
        return self.min_cost_usd is None or row.cost_usd >= self.min_cost_usd


@dataclass
class RunPage:
    rows: list[RunRow]
    total: int
    page: int
    pages: int


def select_runs(
    rows: Iterable[RunRow],
    flt: RunFilter,
    failures: Mapping[str, set[FailureType]],
    now: float,
    page: int = 1,
    per_page: int = PER_PAGE,
) -> RunPage:
    """One page of the runs that match, newest first, and how many matched."""
    matched = [r for r in rows if flt.matches(r, failures, now)]
    matched.sort(key=lambda r: r.updated_ts, reverse=True)
    pages = max(1, math.ceil(len(matched) / per_page))
    page = min(max(1, page), pages)
    return RunPage(matched[(page - 1) * per_page : page * per_page], len(matched), page, pages)


# --- a run's timeline (the waterfall's geometry and durations: loopwarden.runtree.timing) ------------------


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


# --- one queue item: the buttons that fit its state and the operator --------------------------------------


@dataclass(frozen=True)
class ItemControls:
    claim: bool  # "Claim": the item is free (open, or its holder's lease lapsed)
    renew: bool  # "Renew lease": the operator holds it
    resolve: bool  # the resolution forms: resolved items are read-only, someone else's claim blocks them
    note: str  # one line saying why, shown above the buttons


def item_controls(
    status: str, claimed_by: str | None, lease_expires_at: datetime | None, operator: str, now: datetime
) -> ItemControls:
    """Which actions the item page offers ``operator`` now (the escalation service still decides)."""
    if status == "resolved":
        return ItemControls(False, False, False, "resolved: this item is read-only")
    held = status == "claimed" and claimed_by and (lease_expires_at is None or lease_expires_at > now)
    if held and claimed_by == operator:
        return ItemControls(False, True, True, "you hold this item: renew the lease while you work on it")
    if held:
        return ItemControls(False, False, False, f"held by {claimed_by}: only they can resolve it until the lease ends")
    return ItemControls(
        True, False, True, "open: claim it to keep others off while you work, or resolve it now (no claim needed)"
    )


def example_of(schema: Any, depth: int = 0) -> Any:
    """A value that has the schema's shape (the first variant of a choice), to start a hand-made result from."""
    if not isinstance(schema, dict) or depth > 8:
        return None
    if "examples" in schema and isinstance(schema["examples"], list) and schema["examples"]:
        return schema["examples"][0]
    for key in ("const", "default"):
        if key in schema:
            return schema[key]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    for key in ("oneOf", "anyOf", "allOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return example_of(schema[key][0], depth + 1)
    kind = schema.get("type")
    kind = kind[0] if isinstance(kind, list) and kind else kind
    if kind == "object" or "properties" in schema:
        props = schema.get("properties") or {}
        required = schema.get("required") or list(props)
        return {name: example_of(props[name], depth + 1) for name in props if name in required}
    if kind == "array":
        return [example_of(schema.get("items"), depth + 1)]
    return {"string": "", "integer": 0, "number": 0, "boolean": False, "null": None}.get(str(kind))


# --- replaying a run from its page -------------------------------------------------------------------------


def replay_refusal(operator: str, roster: Mapping[str, list[str]] | None, live_tools: bool) -> str | None:
    """Why ``operator`` may not replay a run from the console (None: they may). A replay starts a run, so it
    takes an operator on the roster (``LW_OPERATORS``; no roster: every operator, as the queue has it); one
    that runs real tools for the calls the recording does not cover takes an operator of every kind ('*')."""
    if roster is None:
        return None
    kinds = roster.get(operator)
    if kinds is None:
        return f"replay: {operator} is not on the operators' roster (LW_OPERATORS), and a replay starts a run"
    if live_tools and "*" not in kinds:
        return f"replay: running real tools takes an operator of every kind ('*'); {operator} has {', '.join(kinds)}"
    return None


async def fleet_context(client: Any) -> dict[str, Any]:
    """The fleet's view from a planner for the /fleet page (``loopwarden fleet``), or why it cannot be had now."""
    try:
        return {"view": await client.fleet(), "fleet_error": None}
    except Exception as err:  # no planner answered, or this user may not ask: said on the page
        return {"view": None, "fleet_error": f"the fleet's view is not available: {type(err).__name__} {err}"}
