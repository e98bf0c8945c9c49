"""Rubric checks: declared needs refused, invisible things flagged, unique criterion names."""

from __future__ import annotations

import pytest

from shared.messages import Rubric
from shared.rubric import RubricError, check_rubric, lint_rubric


def test_rubric_lint_refuses_declared_needs_and_flags_invisible_things() -> None:
    with pytest.raises(RubricError, match="needs tool_history"):
        check_rubric(Rubric.model_validate({"criteria": [{"name": "used search", "needs": ["tool_history"]}]}))
    flags = lint_rubric(
        Rubric.model_validate(
            {
                "criteria": [
                    {"name": "includes the session id"},
                    {"name": "응답에 세션 ID를 포함할 것"},
                    {"name": "accurate"},
                ]
            }
        )
    ).flags
    assert len(flags) == 2 and "session id" in flags[0]
    seen = Rubric.model_validate(
        {
            "judge_sees": ["task", "answer", "tool_history"],
            "criteria": [{"name": "called the search tool", "needs": ["tool_history"]}],
        }
    )
    assert check_rubric(seen) == []
    with pytest.raises(ValueError, match="unique"):
        Rubric.model_validate({"criteria": [{"name": "a"}, {"name": "a"}]})
