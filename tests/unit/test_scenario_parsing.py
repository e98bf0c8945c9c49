"""Scenario files: errors name the field, scripted tool behaviour counts attempts."""

from __future__ import annotations

import pytest

from shared.scenario import ScenarioError, parse_scenario


def test_scenario_errors_name_the_field() -> None:
    with pytest.raises(ScenarioError) as err:
        parse_scenario(
            {
                "name": "x",
                "task": "t",
                "planner": [{"tool_calls": [{"input": {}}]}],
                "judge": [{"scores": {"a": 1}, "raw": "x"}],
                "tools": {"s": [{"fail": "maybe"}]},
            }
        )
    text = str(err.value)
    assert "planner[0].tool_calls[0].name: Field required" in text
    assert "judge[0]: Value error, a judge turn has exactly one of scores, raw or error" in text
    assert "tools.s[0].fail: Input should be 'transient', 'timeout' or 'fatal'" in text


def test_scripted_tool_behaviour_counts_attempts() -> None:
    sc = parse_scenario(
        {
            "name": "x",
            "task": "t",
            "tools": {"s": [{"fail": "transient", "times": 2}, {"output": None}, {"fail": "fatal", "times": "always"}]},
        }
    )
    kinds = [(b.fail, b.has_output) for b in (sc.tool_behaviour("s", i) for i in range(5))]  # type: ignore[union-attr]
    assert kinds == [("transient", False), ("transient", False), (None, True), ("fatal", False), ("fatal", False)]
    assert sc.tool_behaviour("other", 0) is None
