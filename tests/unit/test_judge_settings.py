"""A judge with a missing setting does not invent a score: the candidate is not judged, with the reason."""

from __future__ import annotations

from services.judge.handlers import Judge
from shared.bus import Bus
from shared.messages import Candidate, JudgeRequest, Rubric
from shared.providers.anthropic import AnthropicProvider
from shared.providers.scripted import ScriptedProvider
from shared.providers.select import provider_for
from shared.scenario import parse_scenario
from shared.settings import Settings
from shared.telemetry import setup_telemetry


async def test_judge_provider_set_to_anthropic_without_a_key_is_not_judged() -> None:
    settings = Settings(judge_provider="anthropic", anthropic_api_key=None, _env_file=None)  # type: ignore[call-arg]
    judge = Judge(Bus(settings, "judge"), settings, setup_telemetry("judge", settings))
    req = JudgeRequest(
        run_id="r",
        candidate=Candidate(id="r-c1", iteration=1, kind="text", content="an answer"),
        task="t",
        rubric=Rubric.model_validate({"criteria": [{"name": "accurate"}]}),
    )
    verdict = await judge.judge(req)
    assert verdict.status == "not_judged" and verdict.score is None
    assert "ANTHROPIC_API_KEY is not set" in (verdict.not_judged_reason or "")


def test_planner_and_judge_providers_are_chosen_independently() -> None:
    scenario = parse_scenario({"name": "x", "task": "t"})
    settings = Settings(
        planner_provider="scripted",
        judge_provider="anthropic",
        anthropic_api_key="k",
        judge_model="claude-haiku-4-5",
        planner_model="claude-sonnet-4-5",
    )
    assert isinstance(provider_for(settings, "planner", scenario), ScriptedProvider)
    assert isinstance(provider_for(settings, "judge", scenario), AnthropicProvider)
