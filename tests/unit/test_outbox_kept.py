"""The outboxes a run's record keeps (``RunState.remember``): the newest few, and however old, the
newest one that schedules the run's next turn. That advance is taken where its message is handled
(``Planner.transact``) and lives only in the outbox until the turn is applied, so a redelivery after
the turn failed must find it whatever stray messages were applied meanwhile. What this replica has
published leaves the record at its next save (``RunState.published``)."""

from __future__ import annotations

from services.planner.outbox import Outbox, advance
from services.planner.state import MAX_OUTBOX, PublishRecord, RunState
from services.planner.turns import resolve_config, start_run
from shared.messages import RunSubmit, Started, StartedDetail
from shared.settings import Settings


def started() -> RunState:
    submit = RunSubmit(run_id="r1", task="Add two numbers.")
    return start_run(submit, resolve_config(submit, Settings(), {}), []).state


def scheduling(state: RunState) -> list[PublishRecord]:
    out = Outbox(state)
    advance(out)
    return out.items


def test_the_outbox_that_schedules_the_next_turn_outlives_stray_messages() -> None:
    state = started()
    state.remember("outcome.1", scheduling(state))
    for k in range(MAX_OUTBOX + 4):  # stale or repeated messages applied while the turn is pending
        state.remember(f"stray.{k}", [])
    assert "outcome.1" in state.outbox and state.outbox["outcome.1"] == scheduling(state)
    assert len(state.outbox) == MAX_OUTBOX + 1
    assert list(state.outbox)[1:] == [f"stray.{k}" for k in range(4, MAX_OUTBOX + 4)]  # the newest, in order


def test_only_the_newest_scheduling_outbox_is_kept_beyond_the_newest_few() -> None:
    state = started()
    state.remember("outcome.1", scheduling(state))
    state.iteration = state.iteration.model_copy(update={"n": 2})
    state.remember("outcome.2", scheduling(state))
    for k in range(MAX_OUTBOX):
        state.remember(f"stray.{k}", [])
    assert "outcome.1" not in state.outbox and "outcome.2" in state.outbox
    assert len(state.outbox) == MAX_OUTBOX + 1


def test_an_advance_for_another_run_does_not_pin_its_outbox() -> None:
    state = started()
    answer = [item.model_copy(update={"run_id": "parent"}) for item in scheduling(state)]
    state.remember("child.final", answer)
    for k in range(MAX_OUTBOX):
        state.remember(f"stray.{k}", [])
    assert "child.final" not in state.outbox and len(state.outbox) == MAX_OUTBOX


def test_what_was_published_leaves_the_record_and_what_was_not_stays() -> None:
    """``published``: the items whose PubAcks this replica has are dropped from the record's next save;
    the advance of a turn taken in place (never published) stays, and the message stays applied."""
    state = started()
    out = Outbox(state)
    out.event(Started(**out.head("started"), detail=StartedDetail(task="t", answer_mode="auto")))
    advance(out)
    state.remember("outcome.1", out.items)
    events = [i for i in out.items if i.model != "RunAdvance"]
    assert events and len(events) < len(out.items)
    state.published("outcome.1", events)  # published, the advance held back for the inline turn
    assert state.outbox["outcome.1"] == scheduling(state)
    state.published("outcome.1", scheduling(state))
    assert "outcome.1" not in state.outbox and state.seen("outcome.1")
    state.published("never.applied", events)  # nothing to drop: no error, nothing added
    assert "never.applied" not in state.outbox
