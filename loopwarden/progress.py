"""One line per event: what a person watching a run needs to see."""

from __future__ import annotations

from loopwarden.client import Event
from shared import subjects as S
from shared.messages import FINAL_STATUSES


def render(e: Event) -> str | None:
    p = e.payload
    it = p.get("iteration", "")
    tag = f"[it {it}]" if it else "      "
    kind = e.kind
    if kind.startswith("run."):
        k = kind[4:]
        d = p.get("detail", {})
        if k == "started":
            return f"▶ run started ({d.get('answer_mode')} mode): {p.get('summary', '')[6:]}"
        if k == "model_called":
            return (
                f"{tag} model: {p['summary'].split(': ', 1)[-1]} · tokens in {d.get('input_tokens')} "
                f"out {d.get('output_tokens')} · ${d.get('cost_usd', 0):.4f}"
            )
        if k == "tool_dispatched":
            return f"{tag} → {p['summary']}"
        if k == "tool_succeeded":
            extra = " (output repaired)" if d.get("repaired") else ""
            extra += " (from cache)" if d.get("cached") else ""
            extra += f" (fallback: {d['fallback']})" if d.get("fallback") else ""
            return f"{tag} ✓ {d.get('tool')} validated{extra}"
        if k == "tool_failed":
            return f"{tag} ✗ {p['summary']}"
        if k == "tool_blocked":
            return f"{tag} ⊘ {p['summary']}"
        if k == "corrected":
            return f"{tag} ✓ {p['summary']}"
        if k == "judge_requested":
            return f"{tag} ⚖ {p['summary']}"
        if k == "judged":
            return f"{tag} ⚖ verdict {p['summary']}"
        if k == "decided":
            return f"{tag} ⇒ decide {p['summary']}"
        if k == "escalated":
            return f"{tag} ⚑ {p['summary']}"
        if k == "resumed":
            return f"{tag} ↺ {p['summary']}"
        if k in FINAL_STATUSES:
            return f"■ {p['summary']}"
        if k == "simulated_call":
            return f"{tag} ! {p['summary']}"
        return None
    if kind.startswith("tool.attempt."):
        if p.get("ok"):
            return None
        delay = p.get("next_delay_s")
        then = f", retrying in {delay:.2f}s" if delay is not None else ", no retries left"
        return f"       ↻ {p['tool']} attempt {p['attempt']} failed ({p.get('failure_type')}: {p.get('error')}){then}"
    if kind.startswith("failure.loop"):
        return f"{tag} ⟳ loop detected: {p.get('summary', '')[:120]}"
    if kind.startswith("budget."):
        return f"       $ budget {kind[7:]}: {p.get('summary', '')}"
    if kind.startswith("escalation."):
        return f"       ⚑ escalation {kind.split('.')[-1]}: {p.get('escalation_id', '')} {p.get('reason', '')[:100]}"
    if e.subject.startswith(S.FAILURE_PREFIX):
        return None  # shown through the run events
    return None
