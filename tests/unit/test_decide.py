"""The Decide table, row by row, and the precedence between rows."""

from __future__ import annotations

from dataclasses import replace

import pytest

from services.planner.decide import Action, IterationFacts, decide

BASE = IterationFacts(
    guard_blocked=False,
    tool_results_pending=False,
    verdict=None,
    retries_used=0,
    max_retries=2,
    terminal_tool_ran=False,
    answer_produced=False,
)

ROWS = [
    # (facts, action, row)
    (
        replace(BASE, guard_blocked=True, tool_results_pending=True, verdict="failed", answer_produced=True),
        Action.COMPLETE,
        1,
    ),
    (replace(BASE, tool_results_pending=True, verdict="failed", terminal_tool_ran=True), Action.CONTINUE, 2),
    (replace(BASE, verdict="failed", retries_used=1, terminal_tool_ran=True, answer_produced=True), Action.RETRY, 3),
    (replace(BASE, verdict="failed", retries_used=2, terminal_tool_ran=True, answer_produced=True), Action.COMPLETE, 4),
    (replace(BASE, verdict="passed", terminal_tool_ran=True), Action.COMPLETE, 5),
    (replace(BASE, terminal_tool_ran=True), Action.COMPLETE, 5),
    (BASE, Action.CONTINUE, 6),
    (replace(BASE, verdict="passed"), Action.CONTINUE, 6),
    (replace(BASE, answer_produced=True), Action.COMPLETE, 7),
    (replace(BASE, answer_produced=True, verdict="passed"), Action.COMPLETE, 7),
]


@pytest.mark.parametrize(("facts", "action", "row"), ROWS)
def test_every_row(facts: IterationFacts, action: Action, row: int) -> None:
    decision = decide(facts)
    assert (decision.action, decision.row) == (action, row)


def test_zero_retries_allowed_goes_straight_to_row_4() -> None:
    assert decide(replace(BASE, verdict="failed", max_retries=0, answer_produced=True)).row == 4


def test_decide_never_reads_text() -> None:
    # the facts carry no text at all: a 3-character confirmation and a 3000-character essay decide alike
    fields = set(IterationFacts.__dataclass_fields__)
    assert not any("text" in f or "len" in f for f in fields)
