"""A call's outcome in the planner when two are published for one attempt (issue 28, edges 1 and 2): the
executor's ledger lets a known result replace an ``unknown_outcome`` another replica recorded, and each
event kind has its own message id, so the planner may see both. A known result wins, in either order."""

from __future__ import annotations

from services.planner.outcomes import apply_outcome
from services.planner.state import RunState
from shared.messages import FailureType, ToolOutcome
from tests.support.transitions import events, new_run, turn


def told(state: RunState, ftype: FailureType | None, attempt_id: str = "a-c1") -> list[str]:
    out = apply_outcome(
        state,
        ToolOutcome(
            run_id=state.run_id,
            iteration=state.iteration.n,
            call_id="c1",
            attempt_id=attempt_id,
            tool="search",
            requested_tool="search",
            success=ftype is None,
            data={"ok": True} if ftype is None else None,
            failure_type=ftype,
            error=None if ftype is None else "it may or may not have run",
        ),
    )
    return events(out)


def searching() -> RunState:
    state = new_run()
    turn(state, "", ("c1", "search", {"q": "news"}))
    return state


def test_a_known_result_after_an_unknown_outcome_ends_the_wait_for_a_human_and_the_run_goes_on() -> None:
    state = searching()
    record = state.iteration.tool_calls[0]
    assert told(state, "unknown_outcome") == ["tool_failed", "escalated"]
    assert state.status == "awaiting_human" and state.awaiting is not None
    assert told(state, None) == ["decided"]  # the result the executor knew: the model gets it
    assert state.awaiting is None and state.status == "running"
    assert state.iteration.n == 2  # the next turn started with the result
    assert record.status == "succeeded" and not record.is_error


def test_an_unknown_outcome_after_a_known_result_is_stale() -> None:
    state = searching()
    record = state.iteration.tool_calls[0]
    told(state, None)
    assert told(state, "unknown_outcome") == []
    assert state.awaiting is None and record.status == "succeeded"


def test_only_a_known_result_of_the_same_attempt_replaces_an_unknown_outcome() -> None:
    state = searching()
    told(state, "unknown_outcome")
    assert told(state, None, attempt_id="a-c1.fb.other") == []  # another attempt's: not this call's result
    assert told(state, "unknown_outcome") == []  # the same "unknown" again: a duplicate
    assert state.status == "awaiting_human"


def test_a_failure_a_human_is_waiting_on_for_another_reason_takes_no_second_outcome() -> None:
    state = searching()
    told(state, "fatal")
    assert state.status == "awaiting_human"
    assert told(state, None) == []
    assert state.status == "awaiting_human"


def test_an_unknown_outcome_is_applied_under_its_own_id_so_the_known_result_after_it_is_not_a_duplicate() -> None:
    from services.planner import ids

    assert ids.outcome(1, "c1", unknown=True) != ids.outcome(1, "c1") == "outcome.1.c1"
