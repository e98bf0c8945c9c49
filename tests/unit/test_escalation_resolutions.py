"""What each resolution does to a waiting run, as plain functions of the planner's state machine
(``apply_resolution``): the gates (approval, spawn) that have no producer yet included."""

from __future__ import annotations

import pytest

from services.planner.escalations import apply_resolution
from services.planner.state import Awaiting, RunState
from services.planner.turns import resolve_config, start_run
from shared.messages import EscalationAction, EscalationResolution, RunSubmit
from shared.settings import Settings


def waiting(kind: str) -> RunState:
    submit = RunSubmit(run_id="r1", task="Spawn a helper to summarise the logs?")
    state = start_run(submit, resolve_config(submit, Settings(), {}), []).state
    state.status = "awaiting_human"
    state.awaiting = Awaiting(escalation_id="e1", kind=kind, reason="needs a yes or no")
    return state


def resolved(action: EscalationAction, note: str = "", result: object = None, **extra: object) -> EscalationResolution:
    return EscalationResolution(
        escalation_id="e1", run_id="r1", action=action, note=note, result=result, resolved_by="alice", **extra
    )  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kind", "action", "said"), [("spawn", "approve", "approved"), ("approval", "reject", "denied")]
)
def test_a_gate_resumes_the_run_and_tells_the_model_the_answer(kind: str, action: EscalationAction, said: str) -> None:
    state = waiting(kind)
    out = apply_resolution(state, resolved(action, "within budget"))
    assert state.status == "running" and state.awaiting is None
    next_turn = [b.text for b in state.messages[-1].content if b.type == "text"]
    assert f"A human {said} this: within budget" in next_turn
    subjects = [r.subject for r in out.items]
    assert subjects[0] == "lw.v1.evt.run.resumed" and "lw.v1.cmd.run.advance" in subjects  # the model goes on


def test_a_final_answer_ends_the_run_completed_with_the_persons_text() -> None:
    state = waiting("fatal")
    apply_resolution(state, resolved("final_answer", result="Done by hand."))
    assert (state.status, state.final_output) == ("completed", "Done by hand.")
    assert state.final_reason == "final answer provided by alice"


def test_an_sla_abort_says_it_was_the_sla() -> None:
    state = waiting("approval")
    apply_resolution(state, resolved("abort", "no human decided within the SLA: aborted", by_sla=True))
    assert state.status == "stopped" and "aborted by the SLA" in (state.final_reason or "")


def test_a_resolution_for_another_item_changes_nothing() -> None:
    state = waiting("spawn")
    out = apply_resolution(state, resolved("approve").model_copy(update={"escalation_id": "other"}))
    assert state.status == "awaiting_human" and not out.items
