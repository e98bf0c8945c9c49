"""The run view and a queue item as terminal text (pure: lines of text, no printing).

The same facts the console shows: ``tree_lines`` is the run page (the outcome on top, then the steps with
their durations, tokens, cost and status on one time axis), ``step_lines`` one step whole (every section,
nothing cut), ``escalation_lines`` the item page. One-line summaries are cut at a word boundary with a
visible ellipsis (``runtree.clip``), never mid-word. The caller prints the lines through its own printer,
which is where terminal escapes are made harmless.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from loopwarden.runtree import RunTree, Section, Step, clip, countdown, duration
from shared.escalation_actions import offered, withheld
from shared.messages import Escalation

SUMMARY_CHARS = 100


def _usage(step: Step) -> str:
    parts = []
    if step.input_tokens or step.output_tokens:
        cached = f" ({step.cached_tokens} cached)" if step.cached_tokens else ""
        parts.append(f"{step.input_tokens}→{step.output_tokens} tok{cached}")
    if step.cost_usd:
        parts.append(f"${step.cost_usd:.4f}")
    return "  ".join(parts)


def head_lines(tree: RunTree) -> list[str]:
    ended = tree.end_reason or ("waiting for a person" if tree.status == "awaiting_human" else "still running")
    if tree.stall:
        ended = f"stalled: {tree.stall}"
    lines = [
        f"run:      {tree.run_id}",
        f"status:   {tree.status}",
        f"decide:   {tree.decide or 'not yet'}",
        f"ended:    {ended}",
        f"usage:    {tree.input_tokens} in / {tree.output_tokens} out, ${tree.cost_usd:.4f}, "
        f"{duration(tree.span_s) or '0 ms'} on the clock",
        f"task:     {clip(tree.task, 200)}",
    ]
    if tree.failures:
        lines.append("failed:   " + ", ".join(s.id for s in tree.failures))
    return lines


def tree_lines(tree: RunTree) -> list[str]:
    """The run as a tree: one line per step, indented, at ``+offset`` on the run's clock."""
    lines = [*head_lines(tree), ""]
    for depth, s in tree.walk():
        at = f"+{duration(s.start_s) or '0 ms'}"
        took = duration(s.duration_s) or "…"
        label = f"{'  ' * depth}{s.title}"
        lines.append(f"{label:34} {s.status:9} {at:>9} {took:>8}  {_usage(s)}".rstrip())
        if s.summary:
            lines.append(f"{'  ' * depth}  {clip(s.summary, SUMMARY_CHARS)}  [{s.id}]")
        else:
            lines.append(f"{'  ' * depth}  [{s.id}]")
    return lines


def step_lines(step: Step, sections: list[Section]) -> list[str]:
    """One step whole: its line, then every section of its detail in full."""
    lines = [
        f"step:     {step.id} ({step.kind})",
        f"title:    {step.title}",
        f"status:   {step.status}",
        f"took:     {duration(step.duration_s) or 'still going'}  {_usage(step)}".rstrip(),
    ]
    if step.summary:
        lines.append(f"summary:  {step.summary}")
    for sec in sections:
        lines += ["", f"── {sec.title} ──", *sec.text.splitlines()]
    return lines


def _hms(at: datetime | None) -> str:
    return at.astimezone(UTC).strftime("%H:%M:%S") if at else ""


def escalation_lines(item: Escalation, now: datetime | None = None, no_contract: bool = False) -> list[str]:
    """A queue item as the console's item page shows it (``no_contract``: its tool has no output contract, so a
    provided result could only be refused: the actions that carry one are not offered)."""
    now = now or datetime.now(UTC)
    details: Mapping[str, Any] = item.details
    state: str = item.status
    if item.status == "claimed":
        via = f" via {item.claimed_via}" if item.claimed_via else ""
        state += f" by {item.claimed_by}{via}" + (
            f", lease until {_hms(item.lease_expires_at)}" if item.lease_expires_at else ""
        )
    lines = [
        f"escalation: {item.escalation_id}",
        f"run:        {item.run_id}" + (f"   tenant: {item.tenant}" if item.tenant else ""),
        f"kind:       {item.kind}"
        + (f"   tool: {item.tool}" if item.tool else "")
        + (f"   failure: {details['failure_type']}" if details.get("failure_type") else ""),
        f"state:      {state}",
    ]
    if item.sla_deadline and item.status != "resolved":
        lines.append(
            f"SLA:        {item.sla_action} at {_hms(item.sla_deadline)} ({countdown(item.sla_deadline, now)})"
        )
    lines.append(f"allowed:    {', '.join(offered(item.allowed_actions, has_contract=not no_contract))}")
    if left_out := withheld(item.allowed_actions, has_contract=not no_contract):
        lines.append(
            f"            ({', '.join(left_out)} is not offered: no output contract is registered for '{item.tool}')"
        )
    if item.resolution is not None:
        r = item.resolution
        by = "the SLA" if r.by_sla else r.resolved_by
        via = f" via {r.via}" if r.via else ""
        lines.append(f"resolved:   {r.action} by {by}{via}" + (f": {r.note}" if r.note else ""))
        if r.result is not None:
            lines += ["provided:", *_json(r.result)]
    lines += ["", "── What went wrong ──", *item.reason.splitlines()]
    if details.get("error") and details["error"] != item.reason:
        lines += ["", *str(details["error"]).splitlines()]
    if "arguments" in details:
        lines += ["", "── Arguments ──", *_json(details["arguments"])]
    lines += ["", "── Last turns ──"]
    for m in item.context or []:
        for b in m.content:
            if b.type == "text":
                lines.append(f"{m.role}: {b.text}")
            elif b.type == "tool_use":
                lines.append(f"{m.role}: → {b.name} {_json(b.input, indent=None)[0]}")
            else:
                lines.append(f"{m.role}: {'✗' if b.is_error else '←'} {b.content}")
    if not item.context:
        lines.append("(no turns of the run to show)")
    if item.trail:
        lines += ["", "── Trail ──"]
        for e in item.trail:
            who = f" — {e.operator}" + (f" via {e.via}" if e.via else "") if e.operator else ""
            lines.append(
                f"{_hms(e.at)} {e.kind}{who}"
                + (f" ({e.action})" if e.action else "")
                + (f": {e.reason}" if e.reason else "")
            )
    return lines


def _json(value: Any, indent: int | None = 2) -> list[str]:
    import json

    return json.dumps(value, indent=indent, ensure_ascii=False, default=str).splitlines() or [""]
