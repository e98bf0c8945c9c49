"""A fact lives in its table and the rest of the code reads the table's columns: no module outside the table
re-spells a row's name as a condition (an escalation action tested by what it needs, not by its name)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path
from typing import get_args

from shared.escalation_actions import EscalationAction, carries_result, offered, withheld
from shared.failures import (
    EXECUTOR_FAILURES,
    NEVER_RAN,
    RUN_FAILURES,
    SCHEMA_FAILURES,
    TOOL_FAILURES,
    FailureType,
    replaceable,
)

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


# --- failure types: typed as the table's ``FailureType`` wherever they are held ------------------------------
FAILURE_NAMES = re.compile(r"^(failure|failure_type|failure_types|failures|ftype)$")
FAILURE_TYPES = {"FailureType", "HumanFailure", "ScriptedFailure"}  # str keys beside them are run ids, tools


def plain_str_annotations(tree: ast.Module) -> list[str]:
    """Fields, parameters and variables named for a failure type whose annotation holds a plain ``str``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name | ast.Attribute):
            name = node.target.id if isinstance(node.target, ast.Name) else node.target.attr
            annotation = node.annotation
        elif isinstance(node, ast.arg) and node.annotation is not None:
            name, annotation = node.arg, node.annotation
        else:
            continue
        names = {n.id for n in ast.walk(annotation) if isinstance(n, ast.Name)}
        if FAILURE_NAMES.match(name) and "str" in names and not names & FAILURE_TYPES:
            found.append(f"{node.lineno}: {name}: {ast.unparse(annotation)}")
    return found


def test_failure_types_are_typed_by_the_table_never_plain_str() -> None:
    untyped = {path: found for path, tree in sources() if (found := plain_str_annotations(tree))}
    assert not untyped, f"type a failure type as shared.failures.FailureType: {untyped}"


def test_a_word_that_is_no_failure_type_is_refused_where_it_enters() -> None:
    import pytest
    from pydantic import ValidationError

    from loopwarden.console.board import RunFilter
    from shared.records import ToolAttemptRecord

    assert RunFilter.from_query({"failure": " transient "}).failure == "transient"
    assert RunFilter.from_query({}).failure is None
    with pytest.raises(ValueError, match="unknown failure type 'transiant': use one of input_invalid, "):
        RunFilter.from_query({"failure": "transiant"})
    assert ToolAttemptRecord(attempt=1, ok=False, failure_type="timeout").failure_type == "timeout"
    with pytest.raises(ValidationError, match="failure_type"):
        ToolAttemptRecord.model_validate({"attempt": 1, "ok": False, "failure_type": "timed_out"})


# --- groupings and the unknown outcome: read from the failure table's rows and columns ---------------------
def literal_groupings(words: set[str], tree: ast.Module) -> list[str]:
    """Tuples, sets and lists spelling two or more of ``words`` (a ``Literal[...]`` of another vocabulary aside)."""
    declared = {
        id(node.slice)
        for node in ast.walk(tree)
        if isinstance(node, ast.Subscript) and ast.unparse(node.value) == "Literal"
    }
    return [
        f"{node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Tuple | ast.Set | ast.List)
        and id(node) not in declared
        and sum(isinstance(e, ast.Constant) and e.value in words for e in node.elts) >= 2
    ]


def test_failure_groupings_are_derived_from_the_table_never_spelled() -> None:
    words = set(get_args(FailureType))
    spelled = {
        path: found
        for path, tree in sources()
        if path != "shared/failures.py" and (found := literal_groupings(words, tree))
    }
    assert not spelled, f"derive the grouping from shared/failures.py's rows: {spelled}"


def test_the_unknown_outcome_is_read_by_its_columns_never_compared_by_name() -> None:
    replaceable_words = {t for t in get_args(FailureType) if replaceable(t)}
    assert replaceable_words == {"unknown_outcome"}
    named = {
        path: lines
        for path, tree in sources()
        if path != "shared/failures.py"
        and not path.startswith("bench/")  # the chaos report counts escalations of that kind
        and (lines := [node.lineno for node in compares(replaceable_words, tree)])
    }
    assert not named, f"read replaceable() / human_kind() from shared/failures.py: {named}"


def compares(words: set[str], tree: ast.Module) -> list[ast.Compare]:
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare)
        and any(isinstance(c, ast.Constant) and c.value in words for c in (node.left, *node.comparators))
    ]


def test_the_derived_groupings_keep_their_members() -> None:
    assert EXECUTOR_FAILURES == tuple(t for t in TOOL_FAILURES if t != "output_invalid")
    assert RUN_FAILURES == ("loop", "budget", "judge")
    assert NEVER_RAN == ("input_invalid", "unknown_tool")
    assert SCHEMA_FAILURES == ("input_invalid", "output_invalid")
