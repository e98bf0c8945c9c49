"""The planner's transaction decides; the handler drives (issue 25, target shape 2).

``transaction.apply_message`` applies one message to the stored run state and RETURNS what it
scheduled: the outbox, typed while in this process, and the run's next model turn, which the
handler takes (it never calls back into the turn). A redelivered message gives back what it
produced, read from the record, turn included. The model request has one builder,
``context.model_request``, the wrap-up turn being a parameter of it.
"""

from __future__ import annotations

from typing import Any

from services.planner import context as C
from services.planner.outcomes import apply_outcome
from services.planner.state import RunState
from services.planner.transaction import Applied, apply_message
from services.planner.turns import (
    Answered,
    Blocked,
    ProviderFailed,
    Stopped,
    WrappedUp,
    apply_model_response,
    apply_turn,
    resolve_config,
    start_run,
)
from shared.messages import Decided, RunAdvance, RunSubmit, ToolCall, ToolContract, ToolOutcome, ToolUseBlock, Usage
from shared.messages.lean import lean_json
from shared.providers.base import ModelResponse
from shared.settings import Settings

SCHEMA: dict[str, Any] = {"type": "object"}
TOOLS = {"search": ToolContract(name="search", description="Search.", inputSchema=SCHEMA, outputSchema=SCHEMA)}


def running() -> RunState:
    submit = RunSubmit(run_id="r1", task="What is new?")
    return start_run(submit, resolve_config(submit, Settings(), TOOLS), []).state


def dispatched(state: RunState) -> RunState:
    """Turn 1 called ``search`` once (applied as the advance's message)."""
    response = ModelResponse(text="", tool_calls=[ToolUseBlock(id="c1", name="search", input={})], model="m")
    applied = apply_message(state, "advance.1", lambda s: apply_model_response(s, response, TOOLS))
    assert applied is not None
    return applied.state


def succeeded(state: RunState) -> ToolOutcome:
    return ToolOutcome(
        run_id=state.run_id,
        iteration=state.iteration.n,
        call_id="c1",
        attempt_id="a-c1",
        tool="search",
        requested_tool="search",
        success=True,
        data={"ok": True},
    )


def read_back(state: RunState) -> RunState:
    """The record as another replica (or this one after a restart) reads it from lw_runs."""
    state.seal()
    back = RunState.model_validate_json(state.model_dump_json())
    back.loaded(list(state.messages), tail_stored=True)
    return back


def test_an_outcome_that_ends_the_calls_returns_the_next_turn_instead_of_taking_it() -> None:
    state = dispatched(running())
    applied = apply_message(state, "outcome.1.c1", lambda s: apply_outcome(s, succeeded(s)))
    assert applied is not None and applied.changed and not applied.was_done
    rest, turn = applied.scheduled()
    assert isinstance(turn, RunAdvance) and (turn.run_id, turn.iteration) == ("r1", 2)
    own = [i for i in applied.items if isinstance(i.message, RunAdvance)]
    assert len(own) == 1 and own[0].message is turn  # the typed advance itself, not parsed back from JSON
    assert own[0] not in rest and len(rest) == len(applied.items) - 1
    assert state.outbox["outcome.1.c1"] == applied.items  # the record keeps the advance for a redelivery


def test_a_redelivered_message_gives_back_its_outbox_and_turn_from_the_record() -> None:
    state = dispatched(running())
    first = apply_message(state, "outcome.1.c1", lambda s: apply_outcome(s, succeeded(s)))
    assert first is not None
    stored = read_back(state)
    again = apply_message(stored, "outcome.1.c1", lambda s: apply_outcome(s, succeeded(s)))
    assert again is not None and not again.changed and again.was_done  # re-published, never re-applied
    assert stored.iteration.n == 2  # not advanced twice
    assert [i.payload for i in again.items] == [i.payload for i in first.items]  # byte-identical re-publish
    assert all(i.message is None for i in again.items)  # read back: only the stored JSON
    assert again.scheduled()[1] == first.scheduled()[1]  # the turn to take again, parsed from the record


def test_a_stale_message_changes_nothing() -> None:
    state = dispatched(running())
    assert apply_message(state, "outcome.9.c9", lambda s: None) is None
    assert not state.seen("outcome.9.c9")


def test_outbox_items_are_typed_in_the_process_that_produced_them() -> None:
    state = dispatched(running())
    calls = [i for i in state.outbox["advance.1"] if isinstance(i.message, ToolCall)]
    assert len(calls) == 1 and calls[0].payload == lean_json(calls[0].message)  # as it is stored: defaults left out
    applied = apply_message(state, "outcome.1.c1", lambda s: apply_outcome(s, succeeded(s)))
    assert applied is not None
    assert all(i.message is not None and type(i.message).__name__ == i.model for i in applied.items)
    decided = [i.message for i in applied.items if isinstance(i.message, Decided)]  # what the metrics count
    assert len(decided) == 1 and decided[0].detail.action == "continue" and decided[0].detail.row > 0


def test_no_turn_scheduled_means_everything_is_published() -> None:
    state = dispatched(running())
    items = state.outbox["advance.1"]  # the tool call and its events: no turn until the call is back
    assert Applied(state, items, was_done=False).scheduled() == (items, None)


def test_the_wrap_up_turn_is_the_one_request_builder_with_a_reason() -> None:
    state = dispatched(running())
    plain = C.model_request(state, TOOLS, "m", 100)
    wrapped = C.model_request(state, TOOLS, "m", 100, wrap_up="the cost ceiling is near")
    assert plain.tools and not wrapped.tools
    assert wrapped.messages[0] == plain.messages[0] and wrapped.system == plain.system.split("\n- Tools whose")[0]
    assert "the cost ceiling is near" in wrapped.messages[-1].text()
    state.iteration.wrap_up = "the iteration cap is reached"  # the run's own reason, when none is given
    assert "the iteration cap is reached" in C.model_request(state, TOOLS, "m", 100).messages[-1].text()
    assert not C.model_request(state, TOOLS, "m", 100).tools


def answer(text: str = "Done.") -> ModelResponse:
    return ModelResponse(text=text, tool_calls=[], model="m2")


def test_each_thing_a_turn_decides_is_applied_by_its_rule() -> None:
    blocked = running()
    apply_turn(blocked, Blocked("budget exhausted"))
    assert blocked.iteration.guard == "budget exhausted"
    failed = running()
    apply_turn(failed, ProviderFailed("no model"))
    assert failed.status == "failed" and failed.final_reason == "no model"
    refused = running()
    apply_turn(refused, Stopped("refusal", "declined", Usage(input_tokens=3)))
    assert refused.status == "stopped" and refused.model_calls == 1 and refused.usage.input_tokens == 3
    wrapped = running()
    apply_turn(wrapped, WrappedUp(1, "m2", answer("Best so far."), "the cost ceiling is near"))
    assert wrapped.status == "stopped" and wrapped.final_output == "Best so far." and wrapped.model == "m2"
    answered = running()
    out = apply_turn(answered, Answered(1, "m2", answer(), TOOLS))
    assert out is not None and answered.model == "m2" and any("switched model" in w for w in answered.warnings)


def test_an_answer_for_a_turn_the_run_has_left_changes_nothing() -> None:
    state = dispatched(running())  # at turn 1, waiting for its call
    state.iteration.n = 2
    assert apply_turn(state, Answered(1, "m", answer(), TOOLS)) is None
    assert apply_turn(state, WrappedUp(1, "m", answer(), "late")) is None
    state.status = "failed"
    assert apply_turn(state, Answered(2, "m", answer(), TOOLS)) is None
