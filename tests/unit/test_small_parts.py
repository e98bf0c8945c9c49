"""Backoff, loop detection, rubric lint, scenario loading, final output."""

from __future__ import annotations

import random

import pytest

from services.planner.loops import check_call, check_errors, error_key, signature
from shared.backoff import BackoffPolicy, next_delay
from shared.messages import Rubric
from shared.rubric import RubricError, check_rubric, lint_rubric
from shared.scenario import ScenarioError, parse_scenario

POLICY = BackoffPolicy(max_attempts=5, base_delay_s=0.1, max_delay_s=1.0, max_elapsed_s=10.0)


def test_full_jitter_stays_under_the_exponential_ceiling() -> None:
    rng = random.Random(7)
    for attempt in range(1, 5):
        ceiling = min(1.0, 0.1 * 2 ** (attempt - 1))
        delays = [next_delay(POLICY, attempt, 0.0, rng=rng) for _ in range(200)]
        assert all(d is not None and 0 <= d <= ceiling for d in delays)
        assert max(d for d in delays if d is not None) > ceiling * 0.8  # jitter spreads over the range


def test_retry_after_is_a_floor_and_budgets_bound_retries() -> None:
    assert next_delay(POLICY, 1, 0.0, retry_after_s=2.5) == 2.5
    assert next_delay(POLICY, 5, 0.0) is None  # attempts spent
    assert next_delay(POLICY, 1, 9.5, retry_after_s=1.0) is None  # elapsed time spent


def test_identical_calls_alternation_and_repeated_errors() -> None:
    a, b = signature("search", {"q": "x", "n": 1}), signature("search", {"n": 1, "q": "x"})
    assert a == b  # canonical: key order does not matter
    hist = [("search", a), ("search", a)]
    assert check_call(hist, "search", a, window=6, threshold=3).kind == "identical"  # type: ignore[union-attr]
    assert check_call(hist[:1], "search", a, window=6, threshold=3) is None
    c = signature("calc", {"e": "1"})
    assert (
        check_call([("search", a), ("calc", c), ("search", a)], "calc", c, window=6, threshold=3).kind == "alternating"
    )  # type: ignore[union-attr]
    errs = [error_key("search", "HTTP 503 after 1.2s")] * 2 + [error_key("search", "HTTP 503 after 2.9s")]
    assert check_errors(errs, threshold=3).kind == "repeated_error"  # type: ignore[union-attr]
    assert check_errors(errs[:2], threshold=3) is None


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
