"""The failure table (shared/failures.py) and the queue's action table (shared/escalation_actions.py):
the groupings derived from them keep the wire's words and order, and the rules read the rows."""

from __future__ import annotations

from typing import get_args

import pytest

from services.escalation import queue as Q
from services.executor.recovery import model_error
from shared import failures as F
from shared.escalation_actions import ACTIONS, KINDS, allowed_actions, missing, parse_action
from shared.messages import EscalationAction, EscalationKind, FailureType
from shared.scenario import TOOL_OUTCOMES, ToolBehaviour

# --- the derived groupings are the ones the wire, the grants and the subject filters were built on -------


def test_the_groupings_derived_from_the_table_keep_their_members_and_order() -> None:
    assert F.SCHEMA_FAILURES == ("input_invalid", "output_invalid")
    assert F.RETRIED_FAILURES == ("transient", "timeout")
    assert F.HUMAN_FAILURES == ("fatal", "unknown_outcome")
    assert F.TOOL_FAILURES == (
        "input_invalid", "output_invalid", "transient", "timeout", "fatal", "unknown_outcome", "tool_error",
    )  # fmt: skip
    assert F.PLANNER_FAILURES == ("unknown_tool",)
    assert F.CALL_FAILURES == (*F.TOOL_FAILURES, "unknown_tool")
    assert F.SCRIPTED_FAILURES == ("transient", "timeout", "fatal")
    assert TOOL_OUTCOMES == ("succeeded", *F.CALL_FAILURES)


def test_every_failure_type_has_exactly_one_row() -> None:
    assert list(F.FAILURES) == list(get_args(FailureType))


def test_a_scenario_may_script_exactly_the_scriptable_rows() -> None:
    for failure in get_args(FailureType):
        if F.FAILURES[failure].scriptable:
            assert ToolBehaviour(fail=failure).fail == failure
        else:
            with pytest.raises(ValueError):
                ToolBehaviour.model_validate({"fail": failure})


def test_a_failure_raised_to_a_human_is_filed_under_its_rows_kind() -> None:
    assert F.human_kind("unknown_outcome") == "unknown_outcome"
    assert F.human_kind("fatal") == "fatal"
    assert F.human_kind(None) == "fatal"
    assert F.human_kind("transient") == "fatal"  # a type that names no human: the generic kind
    assert [t for t in get_args(FailureType) if F.needs_human(t)] == list(F.HUMAN_FAILURES)


@pytest.mark.parametrize(
    ("failure", "text"),
    [
        ("transient", "'t' is temporarily unavailable (HTTP 503) after 3 attempt(s). Try again later"),
        ("timeout", "'t' did not respond in time (HTTP 503) after 3 attempt(s). It may be overloaded"),
        ("tool_error", "HTTP 503"),
        ("unknown_outcome", "'t' may or may not have completed"),
        ("fatal", "'t' failed and cannot be retried: HTTP 503. A human has been notified."),
    ],
)
def test_the_model_reads_each_failure_in_its_rows_words(failure: FailureType, text: str) -> None:
    assert model_error("t", failure, "HTTP 503", 3).startswith(text)


def test_a_detail_with_braces_reaches_the_model_as_written() -> None:
    assert model_error("t", "tool_error", "no field {x}", 1) == "no field {x}"


# --- the queue's vocabulary ----------------------------------------------------------------------------


def test_every_action_and_kind_has_a_row_and_every_kind_allows_abort() -> None:
    assert set(ACTIONS) == set(get_args(EscalationAction))
    assert set(KINDS) == set(get_args(EscalationKind))
    assert all("abort" in spec.actions for spec in KINDS.values())
    assert set(Q.DEFAULT_SLAS) == set(KINDS)


def test_the_allowed_actions_per_kind_are_the_ones_the_surfaces_show() -> None:
    call = ["provide_result", "retry", "resume", "final_answer", "abort"]
    assert {k: allowed_actions(k) for k in KINDS} == {
        "fatal": call,
        "unknown_outcome": call,
        "schema_cap": call,
        "ask_human": call,
        "not_judged": ["approve", "accept", "reject", "final_answer", "abort"],
        "loop": ["retry", "resume", "final_answer", "abort"],
        "approval": ["approve", "reject", "abort"],
        "spawn": ["approve", "reject", "abort"],
        "stalled": ["requeue", "abort"],
    }


def test_an_unknown_action_is_refused_by_name_with_the_known_ones() -> None:
    assert parse_action("retry") == "retry"
    with pytest.raises(ValueError, match=r"unknown action 'postpone': use one of resume, abort, provide_result"):
        parse_action("postpone")


def test_what_an_action_must_carry_comes_from_its_row() -> None:
    assert missing("provide_result", "", None) == "provide_result needs the tool's result"
    assert missing("provide_result", "", {}) is None
    assert missing("final_answer", "", "  ") == "final_answer needs the answer as text"
    assert missing("retry", " ", None) == "retry needs an instruction for the model (the note)"
    assert missing("abort", "", None) is None
