"""Building the tree: a run's steps on one time axis, from its events (``build``), and ``clip``."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from pydantic import ValidationError

from shared.failures import SCHEMA_FAILURES
from shared.messages import RateLimitedDetail
from shared.records import EventRecord, RunRecord

StepKind = Literal["iteration", "model", "tool", "attempt", "validation", "judge", "decide", "escalation", "end"]
StepStatus = Literal["ok", "failed", "retried", "escalated", "running", "waiting", "repaired"]
ELLIPSIS = "…"
_FINAL_KINDS = ("run.completed", "run.stopped", "run.failed")


def clip(text: str, limit: int) -> str:
    """``text`` on one line, cut to at most ``limit`` characters at a word boundary, with a visible
    ellipsis when cut (never mid-word, unless one word is longer than half the limit)."""
    text = " ".join(str(text).split())
    if len(text) <= limit:
        return text
    cut = text[: max(1, limit - 1)]
    space = cut.rfind(" ")
    if text[len(cut)] != " " and space >= limit // 2:  # the cut falls inside a word: back to the last space
        cut = cut[:space]
    return cut.rstrip(" ,;:.-") + ELLIPSIS


@dataclass
class Step:
    id: str
    kind: StepKind
    title: str
    status: StepStatus
    start_s: float
    end_s: float | None
    summary: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float = 0.0
    children: list[Step] = field(default_factory=list)

    @property
    def duration_s(self) -> float | None:
        return None if self.end_s is None else max(0.0, self.end_s - self.start_s)

    @property
    def failed(self) -> bool:
        return self.status in ("failed", "escalated")


@dataclass
class RunTree:
    run_id: str
    status: str
    task: str
    end_reason: str | None
    decide: str | None  # the last Decide row, e.g. "row 5: complete — terminal tool ran in this iteration"
    span_s: float  # the time axis: first event to last
    started_at: datetime | None
    input_tokens: int
    output_tokens: int
    cost_usd: float
    trace_id: str | None
    steps: list[Step] = field(default_factory=list)
    stall: str | None = None  # why a stalled run waits and what moves it on (status ``stalled``)

    def walk(self) -> Iterator[tuple[int, Step]]:
        """Every step, depth first, with its depth (0: an iteration or an escalation at the top)."""

        def go(steps: list[Step], depth: int) -> Iterator[tuple[int, Step]]:
            for s in steps:
                yield depth, s
                yield from go(s.children, depth + 1)

        yield from go(self.steps, 0)

    def find(self, step_id: str) -> Step | None:
        return next((s for _, s in self.walk() if s.id == step_id), None)

    @property
    def failures(self) -> list[Step]:
        return [s for _, s in self.walk() if s.failed and s.kind not in ("iteration",)]


def _offset(e: EventRecord, t0: datetime | None) -> float:
    if e.time is None or t0 is None:
        return 0.0
    return max(0.0, (e.time - t0).total_seconds())


def _detail(e: EventRecord) -> dict[str, Any]:
    d = e.payload.get("detail")
    return d if isinstance(d, dict) else {}


def _cause(d: dict[str, Any]) -> str:
    try:
        return RateLimitedDetail.model_validate(d).cause
    except ValidationError:  # a newer writer's detail: the fields above say enough
        return ""


def _iteration_of(e: EventRecord) -> int:
    try:
        return int(e.payload.get("iteration") or 0)
    except (TypeError, ValueError):
        return 0


def stall_line(stall: Any) -> str | None:
    """A stalled run's reason and what moves it on, in one line (``RunSnapshot.stall``)."""
    if not isinstance(stall, dict):
        return None
    line = str(stall.get("reason") or "stalled")
    letters = [str(n) for n in stall.get("letters") or []]
    if letters:
        line += f"; hand it back: loopwarden dlq requeue {' '.join(letters)}"
        if stall.get("escalation_id"):
            line += f", or resolve {stall['escalation_id']} in the queue"
    elif stall.get("missing"):
        line += "; it moves on by itself once one is back"
    return line


def build(record: RunRecord) -> RunTree:
    """The run's steps on one time axis, from its events (and, where stored, its other records)."""
    events = sorted(record.events, key=lambda e: e.seq)
    t0 = next((e.time for e in events if e.time is not None), None)
    span = max((_offset(e, t0) for e in events), default=0.0)
    usage = record.usage or {}
    tree = RunTree(
        run_id=record.run_id,
        status=record.status,
        task=record.task,
        end_reason=record.final_reason,
        decide=None,
        span_s=span,
        started_at=t0,
        input_tokens=int(usage.get("input_tokens") or 0),
        output_tokens=int(usage.get("output_tokens") or 0),
        cost_usd=float(usage.get("cost_usd") or 0.0),
        trace_id=record.trace_id,
        stall=stall_line((record.state or {}).get("stall")) if record.status == "stalled" else None,
    )
    iterations: dict[int, Step] = {}
    tools: dict[str, Step] = {}
    judges: dict[str, Step] = {}
    escalations: dict[str, Step] = {}
    prev_at = 0.0
    last_iteration = 1
    waits_seen: list[Step] = []

    def iteration(n: int, at: float) -> Step:
        n = n or last_iteration
        if n not in iterations:
            iterations[n] = Step(f"i{n}", "iteration", f"iteration {n}", "ok", at, at)
            tree.steps.append(iterations[n])
        return iterations[n]

    for e in events:
        at = _offset(e, t0)
        p, d, k = e.payload, _detail(e), e.kind
        n = _iteration_of(e)
        if n:
            last_iteration = n
        if k == "run.model_called":
            n = n or last_iteration
            it = iteration(n, prev_at)
            cached = int(d.get("cache_read_input_tokens") or 0)
            calls = ", ".join(str(c.get("tool")) for c in d.get("calls") or [])
            model = Step(
                f"i{n}.model",
                "model",
                "model turn" + (" (wrap-up)" if d.get("wrap_up") else ""),
                "ok",
                prev_at,
                at,
                summary=(f"called {calls}" if calls else f"{d.get('chars', 0)} chars of text")
                + f" · {d.get('model', '')}",
                input_tokens=int(d.get("input_tokens") or 0),
                output_tokens=int(d.get("output_tokens") or 0),
                cached_tokens=cached,
                cost_usd=float(d.get("cost_usd") or 0.0),
            )
            it.children.append(model)
            for c in d.get("calls") or []:  # each call starts when the turn that asked for it ends
                aid = f"{record.run_id}.i{n}.{c.get('call_id')}"
                step = Step(_tool_id(n, str(c.get("call_id"))), "tool", str(c.get("tool")), "running", at, None)
                step.summary = clip(str(c.get("arguments") or ""), 120)
                tools[aid] = step
                it.children.append(step)
        elif k == "run.model_stopped":
            it = iteration(n, prev_at)
            it.children.append(
                Step(
                    f"i{n}.model",
                    "model",
                    "model turn",
                    "failed",
                    prev_at,
                    at,
                    summary=f"stopped: {d.get('stop_reason', '?')}",
                    input_tokens=int(d.get("input_tokens") or 0),
                    output_tokens=int(d.get("output_tokens") or 0),
                    cost_usd=float(d.get("cost_usd") or 0.0),
                )
            )
        elif k == "run.rate_limited":  # a model call held for its provider key's rate limit
            it = iteration(n, at)
            waiting = Step(
                f"i{n}.wait{len(waits_seen) + 1}",
                "model",
                "waiting for the rate limit" + (" (judge)" if d.get("purpose") == "judge" else ""),
                "waiting",
                at,
                at + float(d.get("wait_s") or 0.0),
                summary=f"{float(d.get('wait_s') or 0.0):.1f}s · {d.get('provider')} key {d.get('account')} · "
                + _cause(d),
            )
            waits_seen.append(waiting)
            it.children.append(waiting)
        elif k.startswith("tool.attempt."):
            step = _tool_step(tools, iterations, tree, p, at, record.run_id)
            ok = bool(p.get("ok"))
            step.children.append(
                Step(
                    f"{step.id}.a{p.get('attempt')}",
                    "attempt",
                    f"attempt {p.get('attempt')}",
                    "ok" if ok else "retried",
                    step.children[-1].end_s or step.start_s if step.children else step.start_s,
                    at,
                    summary="" if ok else f"{p.get('failure_type')}: {clip(str(p.get('error') or ''), 160)}",
                )
            )
        elif k.startswith("tool.succeeded.") or k.startswith("failure."):
            if not p.get("attempt_id"):
                continue
            step = _tool_step(tools, iterations, tree, p, at, record.run_id)
            if p.get("will_retry"):
                continue  # the attempt event says it; the call goes on
            _finish_tool(step, p, at)
        elif k == "run.judge_requested":
            it = iteration(n, at)
            cid = str(d.get("candidate_id") or "")
            judges[cid] = Step(f"i{n}.judge", "judge", "judge", "running", at, None, summary=f"candidate {cid}")
            it.children.append(judges[cid])
        elif k == "judge.verdict":
            cid = str(p.get("candidate_id") or "")
            if cid not in judges:
                judges[cid] = Step(f"i{n}.judge", "judge", "judge", "running", at, None)
                iteration(n, at).children.append(judges[cid])
            j = judges[cid]
            j.end_s = at
            verdict = str(p.get("status"))
            j.status = "ok" if verdict == "passed" else "failed"
            ju = p.get("usage") or {}
            j.input_tokens, j.output_tokens = int(ju.get("input_tokens") or 0), int(ju.get("output_tokens") or 0)
            j.cost_usd = float(ju.get("cost_usd") or 0.0)
            if verdict == "not_judged":
                j.summary = f"not judged: {clip(str(p.get('not_judged_reason') or ''), 140)}"
            else:
                crit = ", ".join(f"{c.get('name')} {float(c.get('score') or 0):.2f}" for c in p.get("criteria") or [])
                j.summary = (
                    f"{verdict}: score {float(p.get('score') or 0):.2f} (threshold {p.get('threshold')}) · {crit}"
                )
        elif k == "run.decided":
            it = iteration(n, at)
            summary = str(p.get("summary") or f"row {d.get('row')}: {d.get('action')}")
            tree.decide = summary
            it.children.append(Step(f"i{n}.decide", "decide", f"Decide row {d.get('row')}", "ok", at, at, summary))
        elif k in ("run.escalated", "escalation.raised"):
            eid = str(p.get("escalation_id") or d.get("escalation_id") or "")
            if eid and eid not in escalations:
                reason = str(p.get("reason") or p.get("summary") or "")
                esc = Step(
                    f"esc.{eid}", "escalation", f"escalation ({d.get('kind') or p.get('kind')})", "waiting", at, None
                )
                esc.summary = clip(reason, 160)
                escalations[eid] = esc
                iteration(n, at).children.append(esc)
        elif k == "escalation.resolved":
            eid = str(p.get("escalation_id") or "")
            held = escalations.get(eid)
            if held is not None:
                esc = held
                esc.end_s, esc.status = at, "escalated"
                by = "the SLA" if p.get("by_sla") else p.get("resolved_by") or p.get("operator") or "?"
                via = f" via {p['via']}" if p.get("via") else ""
                esc.summary = f"{p.get('action')} by {by}{via}" + (
                    f": {clip(str(p['note']), 100)}" if p.get("note") else ""
                )
        elif k in ("run.completed", "run.stopped", "run.failed"):
            ended: StepStatus = "ok" if k == "run.completed" else "failed"
            end = Step("end", "end", k.removeprefix("run."), ended, at, at, clip(str(p.get("summary") or ""), 200))
            tree.steps.append(end)
        if k in ("run.model_called", "run.model_stopped", "judge.verdict") or k in _FINAL_KINDS:
            for w in waits_seen:  # the call it held went (or the run ended): no longer waiting
                w.status = "ok" if w.status == "waiting" else w.status
        if (k.startswith("run.") and k != "run.rate_limited") or k == "judge.verdict":
            prev_at = at
        if k == "run.started" or k == "run.resumed":
            prev_at = at

    for it in iterations.values():
        ends = [c.end_s if c.end_s is not None else c.start_s for c in it.children]
        it.start_s = min([c.start_s for c in it.children], default=it.start_s)
        it.end_s = max(ends, default=it.start_s)
        if any(c.end_s is None for c in it.children):
            it.end_s = None if tree.status == "running" else it.end_s
        for c in it.children:
            it.input_tokens += c.input_tokens
            it.output_tokens += c.output_tokens
            it.cached_tokens += c.cached_tokens
            it.cost_usd += c.cost_usd
        bad = [c for c in it.children if c.failed]
        if any(c.kind == "escalation" for c in it.children):
            it.status = "escalated"
        elif bad:
            it.status = "failed"
        it.summary = ", ".join(c.title for c in it.children if c.kind == "tool") or "no tool calls"
        if bad:
            it.summary += f" · {len(bad)} failed"
    tree.span_s = max([tree.span_s, *(s.end_s or 0.0 for _, s in tree.walk())])
    return tree


def _tool_id(iteration: int, call_id: str) -> str:
    return f"i{iteration}.tool.{call_id}"


def _tool_step(
    tools: dict[str, Step], iterations: dict[int, Step], tree: RunTree, p: dict[str, Any], at: float, run_id: str
) -> Step:
    aid = str(p.get("attempt_id") or "")
    if aid in tools:
        return tools[aid]
    # a fallback (its own attempt id) or an event whose model turn was not seen: a call of its own
    found = re.match(rf"{re.escape(run_id)}\.i(\d+)\.", aid)
    n = int(p.get("iteration") or 0) or (int(found.group(1)) if found else 0)
    step = Step(_tool_id(n, str(p.get("call_id") or aid)), "tool", str(p.get("tool")), "running", at, None)
    if any(s.id == step.id for s in tools.values()):  # a fallback: the same call, another tool
        step.id += f".{p.get('tool')}"
    tools[aid] = step
    it = iterations.get(n)
    (it.children if it else tree.steps).append(step)
    return step


def _finish_tool(step: Step, p: dict[str, Any], at: float) -> None:
    step.end_s = at
    ok = bool(p.get("success"))
    errors = p.get("errors") or []
    failure = p.get("failure_type")
    made = int(p.get("attempts") or 1)
    if made > len(step.children):  # the attempt that returned output has no event of its own
        start = step.children[-1].end_s or step.start_s if step.children else step.start_s
        step.children.append(Step(f"{step.id}.a{made}", "attempt", f"attempt {made}", "ok", start, at))
    stripped = [str(f) for f in p.get("stripped") or []]
    if stripped:  # undeclared input fields removed before the call ran (policy strip): a repair of its input
        summary = "stripped undeclared field(s) " + ", ".join(stripped)
        step.children.append(Step(f"{step.id}.input", "validation", "input validation", "repaired", at, at, summary))
    repairs = (p.get("repairs") or [])[len(stripped) :]  # the output's (the stripped fields come first)
    output_repaired = bool(repairs) or (bool(p.get("repaired")) and not stripped)
    if errors or failure in SCHEMA_FAILURES or output_repaired:
        what = "input" if failure == "input_invalid" else "output"
        if errors:
            paths = ", ".join(sorted({str(e.get("path")) for e in errors if isinstance(e, dict)}))
            summary = f"{len(errors)} {what} error(s) at {paths}"
        else:
            summary = f"{what} invalid" if failure else ""
        if output_repaired:
            summary = (summary + " · " if summary else "") + "repaired: " + ", ".join(repairs)
        status: StepStatus = "failed" if not ok else ("repaired" if output_repaired else "ok")
        step.children.append(Step(f"{step.id}.validation", "validation", f"{what} validation", status, at, at, summary))
    if ok:
        how = [w for w, on in (("repaired", output_repaired), ("from cache", p.get("cached"))) if on]
        how += [f"stripped {', '.join(stripped)}"] if stripped else []
        step.status = "repaired" if p.get("repaired") else "ok"
        step.summary = "ok" + (f" ({', '.join(how)})" if how else "") + f" · {made} attempt(s)"
        if p.get("fallback_from"):
            step.summary += f" · fallback from {(p['fallback_from'] or {}).get('from_tool')}"
    else:
        step.status = "failed"
        step.summary = f"{failure}: {clip(str(p.get('error') or ''), 160)}"
