"""The planner's transitions as plain functions: (state, message) -> (state', what it publishes).

Each row drives the phase modules (``turns``, ``outcomes``, ``judging``, ``escalations``) the way
the handlers do, with no bus, and asserts on the events, commands and status they produce.
"""

from __future__ import annotations

from typing import Any

import pytest

from services.planner import loops
from services.planner.escalations import apply_resolution
from services.planner.judging import apply_verdict
from services.planner.outbox import Outbox
from services.planner.state import MAX_APPLIED, RunState
from services.planner.turns import apply_guard
from shared.messages import (
    Criterion,
    EscalationRaise,
    EscalationResolution,
    LoopDetected,
    Rubric,
    RunEvent,
    RunFinished,
    Verdict,
)
from tests.support.transitions import events, new_run, outcome, turn

RUBRIC = Rubric(criteria=[Criterion(name="accurate")])


def raised(out: Outbox) -> list[EscalationRaise]:
    return [EscalationRaise.model_validate_json(i.payload) for i in out.items if i.model == "EscalationRaise"]


def advances(out: Outbox) -> int:
    return sum(1 for i in out.items if i.model == "RunAdvance")


# --- ending an iteration ---------------------------------------------------------------------------


def test_a_text_answer_with_no_rubric_completes_the_run_by_row_7() -> None:
    state = new_run("text")
    out = turn(state, "Nothing is new.")
    assert events(out) == ["model_called", "decided", "completed"]
    assert state.status == "completed" and state.final_output == "Nothing is new."
    assert state.iteration.decision is not None and state.iteration.decision.row == 7


def test_a_successful_terminal_call_completes_the_run_by_row_5() -> None:
    state = new_run()
    turn(state, "", ("c1", "submit_result", {"answer": "All quiet."}))
    out = outcome(state, "c1")
    assert events(out) == ["decided", "completed"]  # the success itself: the validator's event
    assert state.status == "completed" and state.submitted and state.final_output == "All quiet."


def test_tool_results_the_model_has_not_seen_start_a_work_iteration() -> None:
    state = new_run()
    turn(state, "", ("c1", "search", {"q": "news"}))
    out = outcome(state, "c1")
    assert events(out) == ["decided"] and advances(out) == 1
    assert state.iteration.n == 2 and state.iteration.kind == "work"


def test_a_guard_stops_the_run_by_row_1() -> None:
    state = new_run()
    out = apply_guard(state, "token budget spent")
    assert events(out) == ["guard.budget", "decided", "stopped"]
    assert state.status == "stopped" and state.final_reason == "guard: token budget spent"


# --- a tool call written as text (issue 12, item 10) ----------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>{"name": "search", "arguments": {"q": "news"}}</tool_call>',
        '{"name": "search", "input": {"q": "news"}}',
        "<function_call>search</function_call>",
    ],
)
def test_in_text_mode_a_tool_call_written_as_text_is_not_the_final_answer(text: str) -> None:
    state = new_run("text")
    out = turn(state, text)
    assert events(out) == ["model_called", "simulated_call", "decided"]
    assert state.status == "running" and state.iteration.n == 2 and state.iteration.kind == "synthesis"
    assert state.last_answer == "" and advances(out) == 1


def test_in_text_mode_an_answer_that_mentions_a_tool_is_still_an_answer() -> None:
    state = new_run("text")
    turn(state, "I called search earlier; nothing is new.")
    assert state.status == "completed" and state.final_output == "I called search earlier; nothing is new."


# --- loops: one reaction, whichever way they were found --------------------------------------------


def loop_by_calls(state: RunState, rounds: int) -> list[Outbox]:
    """The same call again and again, each result returned, until the loop is seen ``rounds`` times."""
    outs = []
    for n in range(rounds * 3):
        out = turn(state, "", (f"c{n}", "search", {"q": "same"}))
        outs.append(out)
        if state.iteration.pending:
            outs.append(outcome(state, f"c{n}"))
        if state.status != "running":
            break
    return outs


def loop_by_errors(state: RunState, rounds: int) -> list[Outbox]:
    """Calls with different arguments that fail with the same error, until the run stops moving."""
    outs = []
    for n in range(rounds * 3 + 2):
        outs.append(turn(state, "", (f"c{n}", "search", {"q": f"attempt {n}"})))
        outs.append(outcome(state, f"c{n}", "tool_error", f"index unavailable after {n} ms"))
        if state.status != "running":
            break
    return outs


@pytest.mark.parametrize("found_by", [loop_by_calls, loop_by_errors])
def test_a_loop_that_persists_after_a_reflection_stops_the_run_under_stop(found_by: Any) -> None:
    state = new_run(loop_policy="stop")
    outs = found_by(state, 2)
    loops_seen = [e for out in outs for e in events(out) if e == "loop"]
    assert len(loops_seen) == loops.MAX_LOOP_REFLECTIONS + 1
    assert state.status == "stopped" and "loop persisted" in (state.final_reason or "")


@pytest.mark.parametrize("found_by", [loop_by_calls, loop_by_errors])
def test_a_loop_that_persists_after_a_reflection_escalates_under_escalate(found_by: Any) -> None:
    state = new_run(loop_policy="escalate")
    outs = found_by(state, 2)
    escalations = [r for out in outs for r in raised(out)]
    assert [r.kind for r in escalations] == ["loop"]  # repeated errors escalate too (they used to do nothing)
    assert state.status == "awaiting_human" and state.awaiting is not None and state.awaiting.kind == "loop"
    resolution = EscalationResolution(
        escalation_id=escalations[0].escalation_id,
        run_id="r1",
        action="resume",
        note="use lookup instead",
        resolved_by="alice",
    )
    apply_resolution(state, resolution)
    assert state.status == "running" and state.loop_reflections == 0  # the next loop earns a reflection again


def test_loop_event_ids_are_scoped_by_iteration_when_a_call_id_comes_back() -> None:
    state = new_run(loop_policy="stop", loop_repeat_threshold=2)
    ids = []
    for _ in range(2):  # a scripted model reuses its call ids in every turn
        turn(state, "", ("c1", "search", {"q": "same"}))
        if state.iteration.pending:
            outcome(state, "c1")
    for n in range(3):
        out = turn(state, "", ("c1", "lookup", {"q": n}), ("c2", "lookup", {"q": n}))
        ids += [i.msg_id for i in out.items if i.model == LoopDetected.__name__]
        for call_id in ("c1", "c2"):
            if any(c.call_id == call_id and c.status == "dispatched" for c in state.iteration.tool_calls):
                outcome(state, call_id)
        if state.done:
            break
    assert ids and len(ids) == len(set(ids)), ids


# --- schema corrections and judging ----------------------------------------------------------------


def test_schema_failures_past_the_cap_escalate_naming_the_contract_that_broke() -> None:
    state = new_run(max_schema_corrections=1)
    outs = []
    for n in range(2):
        outs.append(turn(state, "", (f"c{n}", "search", {"q": n})))
        outs.append(outcome(state, f"c{n}", "input_invalid", "q must be a string"))
    escalations = [r for out in outs for r in raised(out)]
    assert [(r.kind, r.details["failure_type"]) for r in escalations] == [("schema_cap", "input_invalid")]
    assert state.status == "awaiting_human"


def verdict(state: RunState, status: str, score: float | None = None) -> Verdict:
    candidate = state.iteration.candidate
    assert candidate is not None
    return Verdict(
        run_id="r1",
        candidate_id=candidate.id,
        iteration=state.iteration.n,
        status=status,  # type: ignore[arg-type]
        score=score,
        threshold=0.8,
        not_judged_reason="the judge failed" if status == "not_judged" else None,
    )


@pytest.mark.parametrize(
    ("first", "second", "first_draft_passed"),
    [
        (("passed", 1.0), None, True),
        (("failed", 0.2), ("passed", 1.0), False),
        (("not_judged", None), ("passed", 1.0), None),  # never judged: not "passed" (issue 12, item 10)
    ],
)
def test_first_draft_passed_says_what_the_judge_said_of_the_first_draft(
    first: tuple[str, float | None], second: tuple[str, float | None] | None, first_draft_passed: bool | None
) -> None:
    state = new_run("text", rubric=RUBRIC, not_judged_policy="retry")
    turn(state, "draft one")
    apply_verdict(state, verdict(state, *first))
    if second is not None:
        turn(state, "draft two")
        out = apply_verdict(state, verdict(state, *second))
        finished = [RunFinished.model_validate_json(i.payload) for i in out.items if i.model == "RunFinished"]
        assert finished and finished[0].detail.first_draft_passed is first_draft_passed
    assert state.status == "completed" and state.first_draft_passed is first_draft_passed


def test_run_event_ids_stay_unique_after_more_messages_than_the_state_remembers() -> None:
    state = new_run("text", rubric=RUBRIC)
    turn(state, "a draft")
    state.applied = [f"m{n}" for n in range(MAX_APPLIED)]  # the remembered window is full
    seen: set[str] = set()
    for n in range(5):
        out = apply_verdict(state, verdict(state, "passed", 1.0)) if n == 0 else Outbox(state)
        out.event(RunEvent.model_validate({"run_id": "r1", "kind": "simulated_call"}).root)
        ids = [i.msg_id for i in out.items]
        assert not seen & set(ids)
        seen |= set(ids)
