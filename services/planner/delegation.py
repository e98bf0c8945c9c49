"""Sub-agents: a run delegates part of its task to a child run through the ``delegate`` tool (pure).

* The child is an ordinary run on the bus (``cmd.run.spawn``: only the planner may publish it, so only
  the planner names a run's parent) with its own task, tools and limits;
  its id is derived from the parent's and the call's, so a re-published spawn is the same run.
* Limits: depth (``max_depth``: a run at that depth is not offered ``delegate``) and fan-out
  (``max_children`` per run); the child's cost ceiling is at most what the parent has left
  (``room_for_child``): its ceiling less what it spent and less the ceilings granted to its children
  still running (``RunState.granted``), so sub-agents started in one turn cannot together overspend
  it. A child's grant is released when its answer arrives, and the parent's spend then holds what
  the child really spent: what it did not spend is the parent's again.
* The spawn gate: the child's estimated cost (its iteration cap times the parent's average cost per
  model call, at most its ceiling) above ``spawn_gate_usd`` raises an escalation of kind ``spawn``;
  the parent waits, and starts the child only if a human approves.
* When the child ends, its final output comes back as the ``delegate`` call's tool outcome
  (``outbox.finish`` publishes it for the parent), carrying the child's usage: the parent adds it
  to its own, so the child's cost counts against the parent's ceiling.
* One trace: the spawn is published inside the parent's span, the child's answer inside the child's.

A run offers ``delegate`` when its tool allowlist names it (delegation is opt-in per run).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

from services.planner import ids
from services.planner.outbox import Outbox, escalate
from services.planner.state import RunConfig, RunState, ToolCallRecord
from shared import subjects as S
from shared.messages import CallDetail, Delegated, DelegatedDetail, RunLimits, RunSubmit, ToolBlocked
from shared.providers.base import ToolSpec

DELEGATE = "delegate"
DELEGATE_SPEC = ToolSpec(
    name=DELEGATE,
    description="Hand a self-contained part of your task to a sub-agent: it works on its own with the tools you "
    "give it and returns its final answer as this call's result. Give it everything it needs in `task`.",
    input_schema={
        "type": "object",
        "properties": {
            "task": {"type": "string", "minLength": 1, "description": "the sub-task, self-contained"},
            "tools": {
                "type": "array",
                "items": {"type": "string"},
                "description": "tools the sub-agent may use (default: yours)",
            },
            "max_iterations": {"type": "integer", "minimum": 1, "description": "its iteration cap"},
            "cost_ceiling_usd": {"type": "number", "exclusiveMinimum": 0, "description": "its cost ceiling"},
        },
        "required": ["task"],
        "additionalProperties": False,
    },
)


def offered(cfg: RunConfig) -> bool:
    return cfg.allowed_tools is not None and DELEGATE in cfg.allowed_tools and cfg.depth < cfg.max_depth


def child_run_id(parent: str, call_id: str) -> str:
    digest = hashlib.sha256(f"{parent}|{call_id}".encode()).hexdigest()[:10]
    return f"{parent[:40]}-sub-{digest}"


def _refuse(record: ToolCallRecord, message: str) -> None:
    record.status = "blocked"
    record.result_text = message
    record.is_error = True


def child_submit(state: RunState, record: ToolCallRecord) -> RunSubmit | str:
    """The child's submission for a delegate call, or why there can be none (a message for the model)."""
    cfg, args = state.config, record.arguments
    task = args.get("task")
    if not isinstance(task, str) or not task.strip():
        return "delegate needs a non-empty `task` string: the sub-task, with everything the sub-agent needs."
    if len(state.children) >= cfg.max_children:
        return f"This run already started {len(state.children)} sub-agent(s), the most it may (fan-out limit)."
    parent_tools = cfg.allowed_tools or []
    wanted = args.get("tools")
    if wanted is not None and (not isinstance(wanted, list) or not all(isinstance(t, str) for t in wanted)):
        return "delegate's `tools` must be a list of tool names."
    tools = [t for t in (wanted or parent_tools) if t in parent_tools]
    for terminal in cfg.terminal_tools:
        if terminal not in tools:
            tools.append(terminal)
    left = room_for_child(cfg.cost_ceiling_usd, state.usage.cost_usd, state.granted.values())
    if left <= 0:
        if state.granted:
            return (
                f"No budget is left for another sub-agent now: the {len(state.granted)} sub-agent(s) still running "
                f"hold the rest of this run's cost ceiling (${cfg.cost_ceiling_usd:.4f}). What they do not spend is "
                "available again once they answer."
            )
        return "No budget is left for a sub-agent: this run's cost ceiling is reached."
    ceiling = min(_number(args.get("cost_ceiling_usd")) or cfg.child_ceiling_usd, cfg.child_ceiling_usd * 10, left)
    iterations = min(int(_number(args.get("max_iterations")) or cfg.child_max_iterations), cfg.max_iterations)
    return RunSubmit(
        run_id=child_run_id(state.run_id, record.call_id),
        task=task,
        limits=RunLimits(max_iterations=max(1, iterations), cost_ceiling_usd=ceiling),
        tools=tools,
        tenant=cfg.tenant,
        parent_run_id=state.run_id,
        parent_call_id=record.call_id,
        parent_iteration=record.iteration,
        depth=cfg.depth + 1,
    )


def room_for_child(ceiling_usd: float, spent_usd: float, granted_usd: Iterable[float]) -> float:
    """What a new sub-agent may be granted: the run's ceiling less what the run spent (its finished
    children's spend included) and less the ceilings already granted to its children still running."""
    return round(ceiling_usd - spent_usd - sum(granted_usd), 8)


def release(state: RunState, call_id: str) -> None:
    """The child of ``call_id`` answered: its grant is released (its real spend is in the run's usage now)."""
    state.granted.pop(call_id, None)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else None


def estimated_cost(state: RunState, submit: RunSubmit) -> float:
    """What the child will likely cost: its iteration cap at this run's average cost per model call,
    at most its ceiling."""
    per_call = state.usage.cost_usd / max(1, state.model_calls)
    cap = submit.limits.cost_ceiling_usd or state.config.child_ceiling_usd
    return round(min(cap, (submit.limits.max_iterations or 1) * per_call), 6)


def dispatch(out: Outbox, record: ToolCallRecord) -> None:
    """A delegate call: refused, gated (a human approves first), or the child run started."""
    s = out.state
    submit = child_submit(s, record)
    if isinstance(submit, str):
        _refuse(record, submit)
        out.event(
            ToolBlocked(
                **out.head(f"delegate refused: {submit}"), detail=CallDetail(tool=DELEGATE, call_id=record.call_id)
            )
        )
        return
    estimate = estimated_cost(s, submit)
    s.children[record.call_id] = submit.run_id
    if estimate > s.config.spawn_gate_usd:
        record.status = "awaiting_human"
        escalate(
            out,
            ids.spawn_escalation(s.run_id, record.iteration, record.call_id),
            "spawn",
            f"a sub-agent is estimated at ${estimate:.4f}, above the spawn gate ${s.config.spawn_gate_usd:.4f}: "
            f"{submit.task[:300]}",
            DELEGATE,
            record.call_id,
            child_run_id=submit.run_id,
            estimated_cost_usd=estimate,
            cost_ceiling_usd=submit.limits.cost_ceiling_usd,
            max_iterations=submit.limits.max_iterations,
            tools=submit.tools,
        )
        return
    spawn(out, record, submit, estimate)


def spawn(out: Outbox, record: ToolCallRecord, submit: RunSubmit | None = None, estimate: float = 0.0) -> None:
    s = out.state
    if submit is None:
        made = child_submit(s, record)
        if isinstance(made, str):
            _refuse(record, made)
            return
        submit = made
        estimate = estimated_cost(s, submit)
    s.children[record.call_id] = submit.run_id
    s.granted[record.call_id] = submit.limits.cost_ceiling_usd or 0.0
    record.status = "dispatched"
    out.add(S.RUN_SPAWN, submit, ids.child_submit(submit.run_id))
    out.event(
        Delegated(
            **out.head(f"sub-agent {submit.run_id} started: {submit.task[:160]}"),
            detail=DelegatedDetail(
                call_id=record.call_id,
                child_run_id=submit.run_id,
                estimated_cost_usd=estimate,
                cost_ceiling_usd=submit.limits.cost_ceiling_usd,
                depth=submit.depth,
            ),
        )
    )


def resolve_gate(out: Outbox, record: ToolCallRecord, approved: bool, note: str) -> None:
    """The spawn gate's answer: start the child, or tell the model it was denied."""
    out.state.children.pop(record.call_id, None)  # the slot taken when the gate was raised: counted again below
    if approved:
        spawn(out, record)
    else:
        _refuse(record, f"A human denied this sub-agent: {note or 'no reason given'}. Continue without it.")
