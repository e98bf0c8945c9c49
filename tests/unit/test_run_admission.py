"""What a run accepts (services/planner/admission.py) and which outcome answers a call (outcomes.answers)."""

from __future__ import annotations

from typing import Any

import pytest

from services.planner.admission import Refused, admit, tenant_of
from services.planner.delegation import DELEGATE
from services.planner.outcomes import answers
from services.planner.state import Iteration, RunState, ToolCallRecord
from shared import subjects as S
from shared.canonical import digest_of
from shared.messages import RunSubmit, ToolOutcome
from shared.settings import Settings
from tests.support.transitions import run_config

SETTINGS = Settings()


def submit(**fields: Any) -> RunSubmit:
    return RunSubmit.model_validate({"run_id": "run-1", "task": "t", **fields})


# --- the tenant is the subject's ------------------------------------------------------------------------


def test_the_tenant_is_the_submit_subjects_last_token() -> None:
    assert admit(submit(), S.run_submit("acme"), SETTINGS).tenant == "acme"
    assert admit(submit(), S.run_submit(), SETTINGS).tenant == S.DEFAULT_TENANT
    assert admit(submit(tenant="acme"), S.run_submit("acme"), SETTINGS).tenant == "acme"


def test_a_body_naming_another_tenant_is_refused() -> None:
    with pytest.raises(Refused, match="tenant 'globex' is not the submitter's: this subject submits for 'acme'"):
        admit(submit(tenant="globex"), S.run_submit("acme"), SETTINGS)


def test_a_subject_of_no_tenant_is_refused() -> None:
    with pytest.raises(Refused, match="not a submit subject of a tenant"):
        tenant_of(S.RUN_SUBMIT_PREFIX)


# --- only the planner starts a child run ----------------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [{"parent_run_id": "victim"}, {"parent_call_id": "toolu_1"}, {"parent_iteration": 1}, {"depth": 1}],
)
def test_a_clients_submit_naming_a_parent_is_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(Refused, match="only the planner starts a sub-agent run"):
        admit(submit(**fields), S.run_submit(), SETTINGS)


def test_the_planners_spawn_keeps_its_parent_and_tenant() -> None:
    child = submit(parent_run_id="p", parent_call_id="c", parent_iteration=2, depth=1, tenant="acme")
    assert admit(child, S.RUN_SPAWN, SETTINGS) == child


# --- limits, scenarios ------------------------------------------------------------------------------------


def test_a_limit_over_its_cap_is_refused_with_the_field_and_the_cap() -> None:
    with pytest.raises(Refused, match=r"limits.cost_ceiling_usd 1e\+09 is over the cap 10000"):
        admit(submit(limits={"cost_ceiling_usd": 1e9}), S.run_submit(), SETTINGS)
    capped = Settings(run_limit_caps={"max_iterations": 20})  # type: ignore[arg-type]
    with pytest.raises(Refused, match=r"limits\.max_iterations 21 is over the cap 20"):
        admit(submit(limits={"max_iterations": 21}), S.run_submit(), capped)
    assert admit(submit(limits={"max_iterations": 20}), S.run_submit(), capped)


def test_a_scenario_is_refused_where_scripted_runs_are_not_allowed_or_when_too_big() -> None:
    scenario = {"name": "s", "task": "t", "planner": [{"text": "x" * 2000}]}
    scripted = submit(scenario=scenario, scenario_digest=digest_of(scenario))
    assert admit(scripted, S.run_submit(), SETTINGS).scenario == scenario
    with pytest.raises(Refused, match=r"scripted runs are not allowed here \(LW_ALLOW_SCRIPTED=false\)"):
        admit(scripted, S.run_submit(), Settings(allow_scripted=False))
    with pytest.raises(Refused, match="over the limit 1024 \\(LW_SCENARIO_MAX_BYTES\\)"):
        admit(scripted, S.run_submit(), Settings(scenario_max_bytes=1024))


def test_settings_refuse_a_cap_on_no_limit() -> None:
    with pytest.raises(ValueError, match="not per-run limits: max_turns"):
        Settings(run_limit_caps={"max_turns": 3})  # type: ignore[arg-type]


# --- an outcome answers only its own call -------------------------------------------------------------------


def state_with(tool: str, children: dict[str, str] | None = None) -> tuple[RunState, ToolCallRecord]:
    record = ToolCallRecord(call_id="toolu_1", tool=tool, arguments={}, iteration=1, signature="s")
    config = run_config(max_judge_retries=1, run_token_budget=10_000, context_budget_tokens=5000, model="m")
    state = RunState(
        run_id="victim", task="t", config=config, iteration=Iteration(n=1, tool_calls=[record]), children=children or {}
    )
    return state, record


def outcome(tool: str, attempt_id: str = "victim.i1.toolu_1") -> ToolOutcome:
    return ToolOutcome(
        run_id="victim",
        iteration=1,
        call_id="toolu_1",
        attempt_id=attempt_id,
        tool=tool,
        requested_tool=tool,
        success=True,
        data="x",
    )


def test_an_outcome_of_another_tool_does_not_answer_the_call() -> None:
    state, record = state_with("charge_card")
    assert answers(state, record, outcome("charge_card"))
    assert not answers(state, record, outcome(DELEGATE, attempt_id="forger"))


def test_a_delegate_call_is_answered_only_by_the_child_this_run_started() -> None:
    state, record = state_with(DELEGATE, {"toolu_1": "victim-sub-abc"})
    assert answers(state, record, outcome(DELEGATE, attempt_id="victim-sub-abc"))
    assert not answers(state, record, outcome(DELEGATE, attempt_id="forger"))
    unstarted, record = state_with(DELEGATE)
    assert not answers(unstarted, record, outcome(DELEGATE, attempt_id="victim-sub-abc"))
