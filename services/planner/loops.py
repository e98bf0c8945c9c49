"""Loops: detection (identical calls, A-B-A-B alternation, the same error again and again) and
the one reaction to a finding.

Detection is pure functions over the run's tool-call history. A finding first earns the model a
reflection message; if the pattern persists after that, the planner stops or escalates the run
(``loop_policy``), whichever way the loop was found. Never an unbounded loop.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from services.planner import ids
from services.planner.context import LOOP_REFLECTION
from services.planner.outbox import Outbox, escalate
from shared import subjects as S
from shared.canonical import call_signature as signature
from shared.messages import LoopDetail, LoopDetected

__all__ = ["MAX_LOOP_REFLECTIONS", "LoopFinding", "check_call", "check_errors", "error_key", "react", "signature"]

MAX_LOOP_REFLECTIONS = 1


@dataclass(frozen=True)
class LoopFinding:
    kind: Literal["identical", "alternating", "repeated_error"]
    what: str

    @property
    def reflection(self) -> str:
        return LOOP_REFLECTION.format(what=self.what)


def check_call(
    history: list[tuple[str, str]], tool: str, sig: str, *, window: int, threshold: int
) -> LoopFinding | None:
    """``history`` is [(tool, signature)] of earlier calls in this run, oldest first."""
    recent = [*history[-(window - 1) :], (tool, sig)] if window > 1 else [(tool, sig)]
    same = sum(1 for _, s in recent if s == sig)
    if same >= threshold:
        return LoopFinding("identical", f"'{tool}' called {same} times with the same arguments")
    last4 = [s for _, s in [*history[-3:], (tool, sig)]]
    if len(last4) == 4 and last4[0] == last4[2] and last4[1] == last4[3] and last4[0] != last4[1]:
        names = [t for t, _ in [*history[-3:], (tool, sig)]]
        return LoopFinding("alternating", f"alternating between '{names[0]}' and '{names[1]}' calls (A-B-A-B)")
    return None


_VOLATILE = re.compile(r"\d+(\.\d+)?")


def error_key(tool: str, error: str) -> str:
    """Errors that differ only in numbers (timings, counts) are the same error."""
    return f"{tool}:{_VOLATILE.sub('#', error.strip().lower())[:200]}"


def check_errors(recent_errors: list[str], *, threshold: int) -> LoopFinding | None:
    """``recent_errors`` are error keys of this run's latest failed calls, oldest first."""
    if len(recent_errors) < threshold:
        return None
    tail = recent_errors[-threshold:]
    if len(set(tail)) == 1:
        tool = tail[0].split(":", 1)[0]
        return LoopFinding("repeated_error", f"the same error from '{tool}' {threshold} times in a row")
    return None


def react(out: Outbox, finding: LoopFinding, tool: str, call_id: str) -> None:
    """The reaction to a loop, whichever way it was found (the caller hands the model the
    reflection): report it, count the reflection, and once the pattern persists after
    ``MAX_LOOP_REFLECTIONS`` reflection(s), stop the iteration or escalate (``loop_policy``)."""
    s, it = out.state, out.state.iteration
    s.loop_reflections += 1
    out.add(
        S.failure("loop", tool),
        LoopDetected(
            **out.head(finding.reflection),
            detail=LoopDetail(pattern=finding.kind, call_id=call_id, reflections=s.loop_reflections),
        ),
        ids.loop(s.run_id, finding.kind, it.n, call_id),
    )
    if s.loop_reflections <= MAX_LOOP_REFLECTIONS:
        return
    if s.config.loop_policy == "escalate":
        if s.awaiting is None:  # one open question per run: a human already looking sees this loop too
            escalate(
                out,
                ids.loop_escalation(s.run_id, it.n),
                "loop",
                f"the model keeps looping ({finding.kind}) after a reflection",
                tool,
                call_id,
            )
    else:
        it.guard = f"loop persisted after {MAX_LOOP_REFLECTIONS} reflection(s): {finding.kind}"
