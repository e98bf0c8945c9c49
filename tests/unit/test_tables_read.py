"""A fact lives in its table and the rest of the code reads the table's columns: no module outside the table
re-spells a row's name as a condition (an escalation action tested by what it needs, not by its name)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import get_args

from shared.escalation_actions import EscalationAction, carries_result, offered, withheld

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("shared", "services", "loopwarden", "bench")


def sources() -> Iterator[tuple[str, ast.Module]]:
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*.py")):
            yield str(path.relative_to(ROOT)), ast.parse(path.read_text(), str(path))


def conditions_on(words: set[str], tree: ast.Module) -> list[int]:
    """The lines where a condition compares with (or a ``match`` case names) one of ``words``."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            if any(isinstance(c, ast.Constant) and c.value in words for c in (node.left, *node.comparators)):
                lines.append(node.lineno)
        elif isinstance(node, ast.MatchValue) and isinstance(node.value, ast.Constant) and node.value.value in words:
            lines.append(node.lineno)
    return lines


# --- escalation actions: read by what they need (shared/escalation_actions.py's ``needs``) ----------------
CARRYING = {a for a in get_args(EscalationAction) if carries_result(a)}
# the table itself, and the planner's ``match`` that applies each action's effect (closed by assert_never)
ACTION_READERS = {"shared/escalation_actions.py", "services/planner/escalations.py"}


def test_actions_that_carry_something_are_tested_by_their_needs_never_by_name() -> None:
    named = {
        path: lines
        for path, tree in sources()
        if path not in ACTION_READERS and (lines := conditions_on(CARRYING, tree))
    }
    assert not named, f"test the action's needs (carries_result / offered), not its name: {named}"


def test_the_console_templates_test_an_action_by_its_needs_never_by_name() -> None:
    names = "|".join(sorted(CARRYING))
    tag = re.compile(r"{%[^%]*['\"](" + names + r")['\"][^%]*%}")
    found = {
        str(p.relative_to(ROOT)): tag.findall(p.read_text())
        for p in (ROOT / "loopwarden" / "console" / "templates").rglob("*.html")
    }
    assert not {p: w for p, w in found.items() if w}, found


def test_an_item_without_an_output_contract_is_offered_every_action_that_carries_no_result() -> None:
    actions: list[EscalationAction] = ["provide_result", "retry", "resume", "final_answer", "abort"]
    assert offered(actions, has_contract=True) == actions
    assert offered(actions, has_contract=False) == ["retry", "resume", "final_answer", "abort"]
    assert withheld(actions, has_contract=False) == ["provide_result"]
    assert withheld(actions, has_contract=True) == []
