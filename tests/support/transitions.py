"""A run driven through the planner's transitions with no bus: a new run, a model turn, a tool's
outcome, and the events an outbox holds; a run with a history of a given length. Several pure test modules
build their rows from these."""

from __future__ import annotations

from typing import Any

from services.planner.outbox import Outbox
from services.planner.outcomes import apply_outcome
from services.planner.state import Iteration, RunConfig, RunState
from services.planner.turns import apply_model_response, resolve_config, start_run
from shared.messages import (
    ChatMessage,
    FailureType,
    Rubric,
    RunEvent,
    RunLimits,
    RunSubmit,
    TextBlock,
    ToolContract,
    ToolOutcome,
    ToolUseBlock,
)
from shared.providers.base import ModelResponse
from shared.settings import Settings


def contract(name: str, terminal: bool = False) -> ToolContract:
    schema = {"type": "object"}
    return ToolContract(name=name, description=name, inputSchema=schema, outputSchema=schema, terminal=terminal)


TOOLS = {c.name: c for c in (contract("search"), contract("lookup"), contract("submit_result", terminal=True))}


def new_run(answer_mode: str = "auto", rubric: Rubric | None = None, **limits: Any) -> RunState:
    submit = RunSubmit(
        run_id="r1",
        task="What is new?",
        answer_mode=answer_mode,  # type: ignore[arg-type]
        rubric=rubric,
        limits=RunLimits(**limits),
    )
    out = start_run(submit, resolve_config(submit, Settings(), TOOLS), [])
    return out.state


def turn(state: RunState, text: str = "", *calls: tuple[str, str, dict[str, Any]]) -> Outbox:
    blocks = [ToolUseBlock(id=call_id, name=name, input=args) for call_id, name, args in calls]
    return apply_model_response(state, ModelResponse(text=text, tool_calls=blocks, model="m"), TOOLS)


def outcome(state: RunState, call_id: str, ftype: FailureType | None = None, error: str = "it broke") -> Outbox:
    record = next(c for c in state.iteration.tool_calls if c.call_id == call_id)
    return apply_outcome(
        state,
        ToolOutcome(
            run_id=state.run_id,
            iteration=state.iteration.n,
            call_id=call_id,
            attempt_id=f"a-{call_id}",
            tool=record.tool,
            requested_tool=record.tool,
            success=ftype is None,
            data={"ok": True} if ftype is None else None,
            failure_type=ftype,
            error=None if ftype is None else error,
        ),
    )


def events(out: Outbox) -> list[str]:
    """The run events and failure events published, by kind, in order."""
    commands = ("RunAdvance", "ToolCall", "JudgeRequest", "EscalationRaise", "EscalationWithdraw")
    return [RunEvent.model_validate_json(i.payload).root.kind for i in out.items if i.model not in commands]


def run_config(**overrides: Any) -> RunConfig:
    """A run's resolved config with small limits, as the pure tests build a state by hand; ``overrides`` change it."""
    fields: dict[str, Any] = {
        "max_iterations": 5,
        "max_judge_retries": 0,
        "max_schema_corrections": 1,
        "cost_ceiling_usd": 1,
        "run_token_budget": 1000,
        "context_budget_tokens": 1000,
        "not_judged_policy": "fail",
        "loop_policy": "stop",
        "loop_window": 6,
        "loop_repeat_threshold": 3,
        "answer_mode": "text",
        "terminal_tools": [],
        "allowed_tools": None,
        "rubric": None,
        "lessons": False,
        "model": "claude-sonnet-4-5",
        "max_output_tokens": 100,
        "max_tool_result_tokens": 100,
        "keep_recent_turns": 2,
    }
    return RunConfig(**(fields | overrides))


def state_of(n: int) -> RunState:
    """A run in its first iteration with ``n`` messages of history (about 50 words each)."""
    cfg = run_config(answer_mode="submit", terminal_tools=["submit_result"], keep_recent_turns=3)
    msgs = [
        ChatMessage(role="user" if i % 2 == 0 else "assistant", content=[TextBlock(text=f"m{i} " * 50)])
        for i in range(n)
    ]
    return RunState(run_id=f"r{n}", task="t", config=cfg, iteration=Iteration(n=1), messages=msgs)
