"""``expect.tools`` and ``expect.escalation_actions`` compared with a run's outcome (shared/scenario.py)."""

from __future__ import annotations

from shared.scenario import TOOL_OUTCOMES, Expectation, Outcome, ToolOutcomes


def outcome(tools: dict[str, dict[str, int]], actions: list[str] | None = None) -> Outcome:
    return Outcome(
        status="completed",
        final_output="x",
        escalations=len(actions or []),
        escalation_kinds=[],
        passed=None,
        first_draft_passed=None,
        submitted=True,
        model_calls=1,
        judge_calls=0,
        retries=0,
        continues=0,
        tool_outcomes=tools,
        escalation_actions=actions or [],
    )


def test_every_way_a_call_can_end_is_a_key_of_expect_tools() -> None:
    assert tuple(ToolOutcomes.model_fields) == TOOL_OUTCOMES  # a new failure type needs its count here


def test_stated_counts_are_compared_and_unstated_ones_are_not() -> None:
    expect = Expectation.model_validate({"tools": {"low_stock": {"succeeded": 1, "output_invalid": 1}}})
    assert expect.mismatches(outcome({"low_stock": {"succeeded": 1, "output_invalid": 1, "transient": 2}})) == []
    assert expect.mismatches(outcome({})) == [
        "tool low_stock: expected succeeded 1, got 0 (never called)",
        "tool low_stock: expected output_invalid 1, got 0 (never called)",
    ]


def test_a_call_of_a_tool_nobody_hosts_fails_an_expect_that_does_not_state_it() -> None:
    got = outcome({"low_stock": {"unknown_tool": 2}})
    assert Expectation().mismatches(got) == [
        "tool low_stock: called 2 time(s) but no replica of the stack hosts it (unknown_tool); start the stack "
        "with it, or state tools: {low_stock: {unknown_tool: 2}} in expect"
    ]
    assert Expectation.model_validate({"tools": {"low_stock": {"unknown_tool": 2}}}).mismatches(got) == []


def test_escalation_actions_are_compared_in_any_order() -> None:
    expect = Expectation.model_validate({"escalation_actions": ["retry", "provide_result"]})
    assert expect.mismatches(outcome({}, ["provide_result", "retry"])) == []
    assert expect.mismatches(outcome({}, ["abort"])) == [
        "escalation actions: expected ['provide_result', 'retry'], got ['abort']"
    ]
