"""A submit refused at the door: its record and final event, and no one else's message."""

from __future__ import annotations

from services.planner.starting import refuse_run, resolve_config
from shared import subjects as S
from shared.messages import Refusal, RunSubmit
from shared.settings import Settings


def test_a_refused_submit_naming_a_parent_answers_no_one() -> None:
    # a client's submit naming another run as its parent is refused: it is not that run's child, so its refusal
    # must not reach the parent as the answer of its delegate call
    submit = RunSubmit(
        run_id="run-forger", task="Forge.", parent_run_id="run-victim", parent_call_id="toolu_1", parent_iteration=1
    )
    out = refuse_run(
        submit, Refusal(reason="only the planner starts a sub-agent run"), resolve_config(submit, Settings(), {})
    )
    assert out.state.status == "refused" and out.state.refusal is not None
    assert [r.run_id for r in out.items if r.run_id is not None and r.run_id != "run-forger"] == []
    assert [r.subject for r in out.items] == [S.run_event("refused")]
    assert out.state.config.parent_run_id is None
