"""The Decide step: what happens at the end of an iteration, from execution state only.

The order is the contract (seed 003). Every input describes *this* iteration — the tool
calls it executed, the candidate it produced, the verdict on that candidate — never the
length of a message or a value left over from an earlier iteration. ``continue`` and
``retry`` are counted separately by the caller, so tool-heavy work never spends retries
and quality rejections cannot loop without bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal


class Action(StrEnum):
    COMPLETE = "complete"
    CONTINUE = "continue"
    RETRY = "retry"


VerdictStatus = Literal["passed", "failed"] | None


@dataclass(frozen=True)
class IterationFacts:
    guard_blocked: bool
    """A guard stopped the run (budget block, persistent loop, iteration or cost cap)."""
    tool_results_pending: bool
    """Tools ran this iteration whose results the model has not seen yet (and no terminal
    tool succeeded: a submission ends the work even beside other calls)."""
    verdict: VerdictStatus
    """The judge's verdict on *this* iteration's candidate; None when not judged."""
    retries_used: int
    max_retries: int
    terminal_tool_ran: bool
    """A terminal tool (e.g. submit_result) executed successfully in *this* iteration,
    read from the tool-call history, never from message text."""
    answer_produced: bool
    """This iteration produced a fresh candidate answer."""


@dataclass(frozen=True)
class Decision:
    action: Action
    row: int
    reason: str


def decide(f: IterationFacts) -> Decision:
    if f.guard_blocked:
        return Decision(Action.COMPLETE, 1, "guard blocked")
    if f.tool_results_pending:
        return Decision(Action.CONTINUE, 2, "tool results pending: the model must see them")
    if f.verdict == "failed" and f.retries_used < f.max_retries:
        return Decision(Action.RETRY, 3, f"judge failed the candidate; retry {f.retries_used + 1}/{f.max_retries}")
    if f.verdict == "failed":
        return Decision(Action.COMPLETE, 4, "judge failed the candidate and retries are spent: keep the current answer")
    if f.terminal_tool_ran:
        return Decision(Action.COMPLETE, 5, "terminal tool ran in this iteration")
    if not f.answer_produced:
        return Decision(Action.CONTINUE, 6, "no answer synthesized yet: synthesis turn")
    return Decision(Action.COMPLETE, 7, "answer exists")
