"""Message ids are built in one place per service (``services/<name>/ids.py``, ``shared/ids.py`` for the
kernel's parts, ``loopwarden/client/ids.py``): exactly-once rests on them, so none is spelled at a publish."""

from __future__ import annotations

import ast
from pathlib import Path

from loopwarden.client import submit_id
from services.escalation import ids as escalation_ids
from services.executor import ids as executor_ids
from shared import ids as shared_ids

ROOT = Path(__file__).resolve().parents[2]


def spelled_ids(tree: ast.Module) -> list[int]:
    """Lines where a message id is an f-string: a ``msg_id=`` argument or a ``msg_id`` variable."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "msg_id" and isinstance(node.value, ast.JoinedStr):
            lines.append(node.value.lineno)
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.JoinedStr):
            if any(isinstance(t, ast.Name) and t.id == "msg_id" for t in node.targets):
                lines.append(node.lineno)
    return lines


def test_no_message_id_is_spelled_outside_an_ids_module() -> None:
    spelled = {
        str(path.relative_to(ROOT)): lines
        for top in ("shared", "services", "loopwarden", "bench")
        for path in sorted((ROOT / top).rglob("*.py"))
        if path.name != "ids.py" and (lines := spelled_ids(ast.parse(path.read_text())))
    }
    assert not spelled, f"build the message id in the package's ids.py: {spelled}"


def test_a_redelivered_call_publishes_under_the_same_ids_and_each_kind_under_its_own() -> None:
    kinds = [
        executor_ids.attempt_failed("a1", 1, 2),
        executor_ids.retrying("a1", 1, 2),
        executor_ids.failed("a1", "fatal"),
        executor_ids.failed("a1", "transient"),
        executor_ids.undeliverable("a1"),
    ]
    assert len(set(kinds)) == len(kinds)
    assert executor_ids.failed("a1", "fatal") == executor_ids.failed("a1", "fatal")
    assert executor_ids.attempt_failed("a1", 2, 2) != executor_ids.attempt_failed("a1", 1, 2)  # a second run of it


def test_a_dead_letter_is_kept_once_per_message_and_each_refusal_is_kept() -> None:
    assert shared_ids.dead_letter("judge", "lw.x", 7) == shared_ids.dead_letter("judge", "lw.x", 7)
    assert shared_ids.dead_letter("judge", "lw.x", 7, requeued_from=3) != shared_ids.dead_letter("judge", "lw.x", 7)
    assert shared_ids.dead_letter("judge", "lw.x", None) != shared_ids.dead_letter("judge", "lw.x", None)
    assert escalation_ids.refused("e1") != escalation_ids.refused("e1")
    assert escalation_ids.raised("e1") == escalation_ids.raised("e1") != escalation_ids.resolved("e1")
    assert submit_id("r1") == submit_id("r1")
