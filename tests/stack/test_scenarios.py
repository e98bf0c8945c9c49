"""Every scenario file in scenarios/ runs end to end and ends the way its `expect` says."""

from __future__ import annotations

from pathlib import Path

import pytest

from loopwarden.client import Client
from shared.scenario import load_scenario
from tests.support.paths import ROOT
from tests.support.timing import bound

FILES = sorted((ROOT / "scenarios").glob("*.y*ml")) + sorted((ROOT / "scenarios").glob("*.json"))


def test_there_are_scenarios() -> None:
    assert len(FILES) >= 10


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
async def test_scenario_meets_its_expectation(client: Client, path: Path) -> None:
    scenario = load_scenario(path)
    assert scenario.expect is not None, f"{path.name} has no expect block"
    state, mismatches = await client.run_and_check(scenario, timeout=bound(90))
    assert not mismatches, f"{path.name} (run {state.run_id}): " + "; ".join(mismatches)


async def test_a_wrong_expectation_is_reported(client: Client) -> None:
    scenario = load_scenario(ROOT / "scenarios" / "submit-then-confirm.yaml")
    wrong = scenario.model_copy(
        update={
            "expect": scenario.expect.model_copy(  # type: ignore[union-attr]
                update={"status": "stopped", "final_output_contains": "nope", "max_model_calls": 0}
            )
        }
    )
    _, mismatches = await client.run_and_check(wrong)
    assert mismatches == [
        "status: expected stopped, got completed",
        "final output does not contain 'nope': 'JetStream keys de-duplication on Nats-Msg-Id.'",
        "model calls: expected at most 0, got 1",
    ]


async def test_a_scripted_judge_without_a_rubric_is_still_consulted(client: Client) -> None:
    from shared.scenario import parse_scenario

    scenario = parse_scenario(
        {
            "name": "judge-without-rubric",
            "task": "Explain.",
            "planner": [{"text": "a thin draft"}, {"text": "a better draft"}],
            "judge": [
                {"scores": {"accuracy": 0.4, "cites a source": 0.5}},
                {"scores": {"accuracy": 0.9, "cites a source": 1.0}},
            ],
            "expect": {
                "status": "completed",
                "final_output_equals": "a better draft",
                "judge_calls": 2,
                "retries": 1,
                "passed": True,
                "passed_first_draft": False,
                "submitted": False,
            },
        }
    )
    assert [c.name for c in scenario.effective_rubric().criteria] == ["accuracy", "cites a source"]  # type: ignore[union-attr]
    _, mismatches = await client.run_and_check(scenario)
    assert not mismatches, mismatches


def test_an_unknown_expectation_is_refused_by_name() -> None:
    from shared.scenario import ScenarioError, parse_scenario

    with pytest.raises(ScenarioError, match=r"expect\.final_output_startswith: Extra inputs are not permitted"):
        parse_scenario({"name": "x", "task": "t", "expect": {"final_output_startswith": "a"}})
