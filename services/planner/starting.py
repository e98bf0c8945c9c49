"""Starting a run: its configuration (``resolve_config``), its record while it waits for its tenant's share of
the fleet (``queue_run``), its first message and first turn once admitted (``begin_run``), and the record of a
submit refused at the door (``refuse_run``). Pure: the planner's intake and admission do the I/O."""

from __future__ import annotations

from datetime import datetime

from services.planner import context as C
from services.planner import ids
from services.planner.outbox import Outbox, advance, finish
from services.planner.state import Iteration, RunConfig, RunState
from shared import subjects as S
from shared.messages import (
    DEFAULT_PRIORITY,
    ChatMessage,
    FlowTicket,
    Queued,
    QueuedDetail,
    Refusal,
    RunSubmit,
    Started,
    StartedDetail,
    ToolContract,
)
from shared.rubric import RubricError, check_rubric
from shared.settings import Settings


def resolve_config(submit: RunSubmit, settings: Settings, contracts: dict[str, ToolContract]) -> RunConfig:
    lim = submit.limits
    terminal = [t for t in submit.terminal_tools if t]
    mode = submit.answer_mode
    if mode == "auto" and not any(t in contracts for t in terminal):
        mode = "text"  # no terminal tool to call: answers are text
    return RunConfig(
        max_iterations=lim.max_iterations or settings.max_iterations,
        max_judge_retries=settings.max_judge_retries if lim.max_judge_retries is None else lim.max_judge_retries,
        max_schema_corrections=(
            settings.max_schema_corrections if lim.max_schema_corrections is None else lim.max_schema_corrections
        ),
        cost_ceiling_usd=lim.cost_ceiling_usd or settings.cost_ceiling_usd,
        run_token_budget=lim.run_token_budget or settings.run_token_budget,
        context_budget_tokens=lim.context_budget_tokens or settings.context_budget_tokens,
        not_judged_policy=lim.not_judged_policy or settings.not_judged_policy,
        loop_policy=lim.loop_policy or settings.loop_policy,
        loop_window=settings.loop_window,
        loop_repeat_threshold=lim.loop_repeat_threshold or settings.loop_repeat_threshold,
        answer_mode=mode,
        terminal_tools=terminal,
        allowed_tools=submit.tools,
        rubric=submit.rubric,
        lessons=submit.lessons,
        model=settings.planner_model,
        max_output_tokens=settings.planner_max_output_tokens,
        max_tool_result_tokens=settings.max_tool_result_tokens,
        keep_recent_turns=settings.keep_recent_turns,
        tenant=submit.tenant,
        depth=submit.depth,
        parent_run_id=submit.parent_run_id,
        parent_call_id=submit.parent_call_id,
        parent_iteration=submit.parent_iteration,
        max_depth=settings.delegate_max_depth,
        max_children=settings.delegate_max_children,
        child_ceiling_usd=settings.delegate_ceiling_usd,
        child_max_iterations=settings.delegate_max_iterations,
        spawn_gate_usd=settings.spawn_gate_usd,
        max_rate_limit_wait_s=lim.max_rate_limit_wait_s,
    )


def start_run(submit: RunSubmit, config: RunConfig, lessons: list[str]) -> Outbox:
    """A run started at once (a sub-agent's, which is never queued): queued and begun in one step."""
    state = accepted_run(submit, config)
    out = begin_run(state, lessons, at=state.created_at)
    assert out is not None
    return out


def queue_run(submit: RunSubmit, config: RunConfig, priority: int = DEFAULT_PRIORITY) -> Outbox:
    """The record of an accepted run that waits for its tenant's share of the fleet (status ``queued``): its
    configuration is resolved now, everything that starts it (its first message, lessons, the first turn) when
    it is admitted (``begin_run``). The outbox says it is queued and holds its ticket."""
    state = accepted_run(submit, config, priority)
    out = Outbox(state)
    tenant = submit.tenant or S.DEFAULT_TENANT
    out.event(
        Queued(
            **out.head(f"queued for tenant {tenant}'s share of the fleet (priority {priority})"),
            detail=QueuedDetail(priority=priority, tenant=tenant),
        )
    )
    ticket = FlowTicket(run_id=submit.run_id, tenant=tenant, priority=priority, queued_at=state.created_at)
    out.add(S.flow_ticket(tenant, priority), ticket, ids.ticket(submit.run_id))
    return out


def accepted_run(submit: RunSubmit, config: RunConfig, priority: int = DEFAULT_PRIORITY) -> RunState:
    """The state of an accepted run before it starts (status ``queued``), nothing published: a run that starts at
    the door goes from here to ``begin_run`` at once, without the queue's event and ticket (``queue_run``)."""
    return RunState(
        run_id=submit.run_id,
        task=submit.task,
        status="queued",
        config=config,
        iteration=Iteration(n=0),
        model=config.model,
        priority=priority,
        tenant=submit.tenant,
        agent=config.agent,
        agent_version=config.agent_version,
    )


def begin_run(state: RunState, lessons: list[str], at: datetime, problem: str | None = None) -> Outbox | None:
    """A queued run admitted ``at``: its first message and its first turn (None: it is not queued any more). A
    scripted run whose scenario could not be bound (``problem``) fails at once, saying why."""
    if state.status != "queued":
        return None
    state.status = "running"
    state.admitted_at = at
    state.pending_scenario = None
    # what the submit published at the door (run.queued, the ticket) is in the streams: the run was admitted by
    # taking that ticket, so the record stops carrying it
    state.outbox.pop(ids.SUBMIT, None)
    state.iteration = Iteration(n=1)
    state.messages = [ChatMessage.user(C.opening_message(state.task, lessons))]
    config = state.config
    out = Outbox(state)
    if problem is not None:
        finish(out, "failed", f"scenario refused: {problem}")
        return out
    if config.rubric is not None:
        try:
            state.warnings.extend(check_rubric(config.rubric))
        except RubricError as err:
            finish(out, "failed", f"rubric refused: {err}")
            return out
    out.event(
        Started(
            # the line for people names the task; the detail carries it (up to 200 characters), stored once
            **out.head("task: " + (state.task if len(state.task) <= 60 else state.task[:59] + "…")),
            detail=StartedDetail(
                task=state.task[:200],
                lessons=len(lessons),
                warnings=state.warnings,
                answer_mode=config.answer_mode,
                waited_s=round(state.waited_s, 3),
                priority=state.priority,
            ),
        )
    )
    advance(out)
    return out


def refuse_run(submit: RunSubmit, refusal: Refusal, config: RunConfig) -> Outbox:
    """The record of a submit refused at the door (status ``refused``, final, with the typed ``refusal``) and its
    final event (``run.refused``, the refusal in its detail): nothing of it starts, and it answers no one (a
    submit naming a parent is not that parent's child: only the planner starts one)."""
    config = config.model_copy(update={"parent_run_id": None, "parent_call_id": None, "parent_iteration": 0})
    state = RunState(
        run_id=submit.run_id,
        task=submit.task,
        config=config,
        iteration=Iteration(n=0),
        tenant=submit.tenant,
        priority=submit.priority if submit.priority is not None else DEFAULT_PRIORITY,
        agent=submit.agent,
        refusal=refusal,
    )
    out = Outbox(state)
    finish(out, "refused", refusal.reason)
    return out
