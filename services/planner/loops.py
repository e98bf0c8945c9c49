"""Loop detection: identical calls, A-B-A-B alternation, the same error again and again.

Pure functions over the run's tool-call history. A finding first earns the model a
reflection message; if the pattern persists after that, the planner stops or escalates
the run (configurable). Never an unbounded loop.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from shared.canonical import call_signature as signature

__all__ = ["LoopFinding", "check_call", "check_errors", "error_key", "signature"]

REFLECTION = (
    "You are repeating yourself: {what}. Repeating it will not change the result. Step back, "
    "review what you have tried, and choose a clearly different approach: different arguments, a different "
    "tool, or answer with what you already have."
)


@dataclass(frozen=True)
class LoopFinding:
    kind: Literal["identical", "alternating", "repeated_error"]
    what: str

    @property
    def reflection(self) -> str:
        return REFLECTION.format(what=self.what)


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
