"""A parent's budget and its sub-agents (pure): what a new child may be granted is the parent's ceiling
less what it spent and less the ceilings of its children still running; a child's answer releases its
grant, and what it did not spend is the parent's again."""

from __future__ import annotations

from typing import Any

import pytest

from services.planner.delegation import child_submit, room_for_child
from services.planner.outcomes import apply_outcome
from services.planner.state import RunState, ToolCallRecord
from services.planner.turns import apply_model_response, resolve_config, start_run
from shared.messages import RunLimits, RunSubmit, ToolContract, ToolOutcome, ToolUseBlock, Usage
from shared.providers.base import ModelResponse
from shared.settings import Settings


@pytest.mark.parametrize(
    ("ceiling", "spent", "granted", "room"),
    [
        (0.10, 0.0, [], 0.10),  # nothing spent, nothing granted: the whole ceiling
        (0.10, 0.0004, [], 0.0996),  # the parent's own turns count
        (0.10, 0.0004, [0.0996], 0.0),  # one running child holds the rest: nothing for a second
        (0.10, 0.0004, [0.05], 0.0496),  # a child that asked for less leaves the difference
        (0.10, 0.0004, [0.03, 0.03], 0.0396),  # several running children all count
        (0.10, 0.0634, [], 0.0366),  # a child ended having spent 0.063 of its grant: the rest is back
        (0.10, 0.11, [], -0.01),  # overspent (a call billed above its estimate): nothing, never a negative grant
    ],
)
def test_a_new_child_may_have_the_ceiling_less_spend_and_running_grants(
    ceiling: float, spent: float, granted: list[float], room: float
) -> None:
    assert room_for_child(ceiling, spent, granted) == room


def contract(name: str, terminal: bool = False) -> ToolContract:
    schema = {"type": "object"}
    return ToolContract(name=name, description=name, inputSchema=schema, outputSchema=schema, terminal=terminal)


TOOLS = {c.name: c for c in (contract("calculator"), contract("submit_result", terminal=True))}


def parent(ceiling: float) -> RunState:
    submit = RunSubmit(
        run_id="parent",
        task="Split the work.",
        limits=RunLimits(cost_ceiling_usd=ceiling),
        tools=["calculator", "delegate", "submit_result"],
    )
    state = start_run(submit, resolve_config(submit, Settings(), TOOLS), []).state
    state.usage = Usage(input_tokens=100, output_tokens=10, cost_usd=0.0004)
    return state


def delegate(state: RunState, *calls: tuple[str, dict[str, Any]]) -> None:
    blocks = [ToolUseBlock(id=call_id, name="delegate", input=args) for call_id, args in calls]
    apply_model_response(state, ModelResponse(text="", tool_calls=blocks, model="m"), TOOLS)


def answered(state: RunState, call_id: str, spent_usd: float) -> None:
    apply_outcome(
        state,
        ToolOutcome(
            run_id=state.run_id,
            iteration=state.iteration.n,
            call_id=call_id,
            attempt_id=state.children[call_id],
            tool="delegate",
            requested_tool="delegate",
            success=True,
            data="done",
            attempts=0,
            usage=Usage(input_tokens=1000, output_tokens=100, cost_usd=spent_usd),
        ),
    )


def result(state: RunState, call_id: str) -> str:
    record = next(c for c in state.iteration.tool_calls if c.call_id == call_id)
    return record.result_text or ""


def test_two_children_in_one_turn_share_the_parents_room_instead_of_each_taking_all_of_it() -> None:
    state = parent(0.10)
    delegate(state, ("c1", {"task": "first half"}), ("c2", {"task": "second half"}))
    assert state.granted == {"c1": 0.0996}  # the first took what was left; the second was told why not
    assert "c2" not in state.children
    assert "sub-agent(s) still running hold the rest" in result(state, "c2")


def test_children_asking_for_less_each_get_what_they_asked_within_the_room() -> None:
    state = parent(0.10)
    delegate(
        state,
        ("c1", {"task": "a", "cost_ceiling_usd": 0.04}),
        ("c2", {"task": "b", "cost_ceiling_usd": 0.04}),
        ("c3", {"task": "c", "cost_ceiling_usd": 0.04}),
    )
    assert state.granted == {"c1": 0.04, "c2": 0.04, "c3": 0.0196}
    assert round(state.usage.cost_usd + sum(state.granted.values()), 8) == 0.10


def test_a_childs_answer_releases_its_grant_and_what_it_did_not_spend_is_granted_again() -> None:
    state = parent(0.10)
    delegate(state, ("c1", {"task": "first"}))
    answered(state, "c1", 0.03)
    assert state.granted == {}
    assert state.usage.cost_usd == 0.0304
    state.iteration.tool_calls.clear()
    submit = child_submit(state, _record("c9"))
    assert not isinstance(submit, str)
    assert submit.limits.cost_ceiling_usd == 0.0696


def _record(call_id: str) -> ToolCallRecord:
    return ToolCallRecord(call_id=call_id, tool="delegate", arguments={"task": "again"}, iteration=2, signature="s")
