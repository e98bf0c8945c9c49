"""The run state machine: pure transitions from (state, message) to (state', messages to publish).

No bus and no I/O here: handlers load the state, call one ``apply_*`` function, remember the
message as applied (with what it produced), save the state with compare-and-swap, then
publish what it returned (with deterministic message
ids, so a re-publish after a crash is absorbed by JetStream de-duplication).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from services.planner import context as C
from services.planner.decide import Action, IterationFacts, decide
from services.planner.loops import check_call, check_errors, error_key, signature
from services.planner.state import (
    Awaiting,
    DecisionRecord,
    Iteration,
    PublishRecord,
    RunConfig,
    RunState,
    ToolCallRecord,
)
from shared import subjects as S
from shared.messages import (
    Candidate,
    ChatMessage,
    EscalationRaise,
    EscalationResolution,
    JudgeRequest,
    RunEvent,
    RunSubmit,
    TextBlock,
    ToolCall,
    ToolContract,
    ToolOutcome,
    ToolUseBlock,
    Usage,
    Verdict,
    escalation_id_for_call,
)
from shared.providers.base import ModelResponse
from shared.rubric import RubricError, check_rubric
from shared.settings import Settings

MAX_LOOP_REFLECTIONS = 1


@dataclass
class Outbox:
    """Messages a transition wants published, in order."""

    state: RunState
    items: list[PublishRecord] = field(default_factory=list)

    def add(self, subject: str, payload: BaseModel, msg_id: str) -> None:
        self.items.append(
            PublishRecord(
                subject=subject,
                msg_id=msg_id,
                payload=payload.model_dump_json(by_alias=True),
                model=type(payload).__name__,
            )
        )

    def event(self, kind: str, summary: str, /, **detail: Any) -> None:
        s = self.state
        seq = len(s.applied) * 100 + len(self.items)
        self.add(
            S.run_event(kind),
            RunEvent(
                run_id=s.run_id, kind=kind, iteration=s.iteration.n, status=s.status, summary=summary, detail=detail
            ),
            f"{s.run_id}.evt.{kind}.{s.iteration.n}.{seq}",
        )


# --- starting a run ---------------------------------------------------------------------------


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
        scripted=submit.scripted,
        lessons=submit.lessons,
        model=settings.planner_model,
        max_output_tokens=settings.planner_max_output_tokens,
        max_tool_result_tokens=settings.max_tool_result_tokens,
        keep_recent_turns=settings.keep_recent_turns,
    )


def start_run(submit: RunSubmit, config: RunConfig, lessons: list[str]) -> Outbox:
    state = RunState(
        run_id=submit.run_id,
        task=submit.task,
        config=config,
        iteration=Iteration(n=1),
        model=config.model,
        messages=[ChatMessage.user(C.opening_message(submit.task, lessons))],
    )
    out = Outbox(state)
    if config.rubric is not None:
        try:
            state.warnings.extend(check_rubric(config.rubric))
        except RubricError as err:
            _finish(out, "failed", f"rubric refused: {err}")
            return out
    out.event(
        "started",
        f"task: {submit.task[:200]}",
        lessons=len(lessons),
        warnings=state.warnings,
        answer_mode=config.answer_mode,
    )
    _advance(out)
    return out


# --- model turns ------------------------------------------------------------------------------


def _advance(out: Outbox) -> None:
    s = out.state
    out.add(
        S.RUN_ADVANCE,
        RunEvent(run_id=s.run_id, kind="advance", iteration=s.iteration.n),
        f"{s.run_id}.adv.{s.iteration.n}",
    )


def apply_guard(state: RunState, reason: str, failure: str = "budget") -> Outbox:
    """A guard (budget, cost, iteration cap) blocked the iteration before its model call."""
    out = Outbox(state)
    state.iteration.guard = reason
    out.add(
        S.failure(failure, None),
        RunEvent(run_id=state.run_id, kind=f"guard.{failure}", iteration=state.iteration.n, summary=reason),
        f"{state.run_id}.guard.{state.iteration.n}",
    )
    _decide(out)
    return out


def apply_provider_failure(state: RunState, reason: str) -> Outbox:
    out = Outbox(state)
    _finish(out, "failed", reason)
    return out


def apply_model_response(state: RunState, response: ModelResponse, contracts: dict[str, ToolContract]) -> Outbox:
    out = Outbox(state)
    it = state.iteration
    cfg = state.config
    state.model_calls += 1
    state.usage = state.usage + response.usage
    text = response.text or ""
    it.assistant_text = text
    if text.strip():
        state.last_text = text
    blocks: list[Any] = ([TextBlock(text=text)] if text else []) + list(response.tool_calls)
    state.messages.append(ChatMessage(role="assistant", content=blocks or [TextBlock(text="")]))
    out.event(
        "model_called",
        f"model turn {it.n}: {len(response.tool_calls)} tool call(s), {len(text)} chars",
        input_tokens=response.usage.input_tokens,
        output_tokens=response.usage.output_tokens,
        cost_usd=response.usage.cost_usd,
        model=response.model,
    )

    if not response.tool_calls:
        # A text that only *claims* a tool call is not an answer (nor a submission): say so and go on.
        simulated = bool(text.strip()) and cfg.answer_mode != "text" and _describes_tool_call(text, contracts)
        if simulated:
            it.notes.append(
                "Your last reply described a tool call in text. That does not run anything: to call a "
                "tool, use the tool interface."
            )
            out.event("simulated_call", "a tool call was described in text, not made")
        elif cfg.answer_mode != "submit" and text.strip():
            it.candidate = Candidate(id=f"{state.run_id}-c{it.n}", iteration=it.n, kind="text", content=text)
            state.last_answer = text
        _finish_iteration(out)
        return out

    for call in response.tool_calls:
        _dispatch(out, call, contracts)
    if not it.pending and state.awaiting is None:
        _finish_iteration(out)
    return out


def _describes_tool_call(text: str, contracts: dict[str, ToolContract]) -> bool:
    names = "|".join(re.escape(n) for n in contracts)
    if not names:
        return False
    pattern = rf"(\b({names})\s*\()|(\"name\"\s*:\s*\"({names})\")|(<tool_use>)|(\bcall(ed|ing)?\s+`?({names})`?)"
    return re.search(pattern, text) is not None


def _dispatch(out: Outbox, call: ToolUseBlock, contracts: dict[str, ToolContract]) -> None:
    s, it, cfg = out.state, out.state.iteration, out.state.config
    sig = signature(call.name, call.input)
    record = ToolCallRecord(
        call_id=call.id,
        tool=call.name,
        arguments=call.input,
        iteration=it.n,
        signature=sig,
        terminal=call.name in cfg.terminal_tools,
    )
    it.tool_calls.append(record)
    contract = contracts.get(call.name)
    offered = cfg.allowed_tools is None or call.name in cfg.allowed_tools or call.name in cfg.terminal_tools
    if contract is None or not offered:
        available = ", ".join(sorted(n for n in contracts if cfg.allowed_tools is None or n in cfg.allowed_tools))
        _block(record, f"There is no tool named '{call.name}'. Available tools: {available}.")
        out.event("tool_blocked", f"unknown tool {call.name}")
        s.tool_history.append((call.name, sig))
        return
    # A tool in a schema-failure streak is on the correction path, which has its own cap and
    # ends with a human: repeating an invalid call is a failed correction, not a loop.
    in_correction = s.schema_streak.get(call.name, 0) > 0
    finding = (
        None
        if in_correction
        else check_call(s.tool_history, call.name, sig, window=cfg.loop_window, threshold=cfg.loop_repeat_threshold)
    )
    s.tool_history.append((call.name, sig))
    if finding is not None:
        _on_loop(out, record, finding.kind, finding.reflection)
        return
    record.terminal = contract.terminal or call.name in cfg.terminal_tools
    out.add(
        S.tool_execute(call.name),
        ToolCall(
            run_id=s.run_id,
            iteration=it.n,
            call_id=call.id,
            attempt_id=S.kv_key(s.run_id, f"i{it.n}", call.id),
            tool=call.name,
            requested_tool=call.name,
            arguments=call.input,
            scripted=cfg.scripted,
        ),
        f"{s.run_id}.call.{it.n}.{call.id}",
    )
    out.event(
        "tool_dispatched",
        f"{call.name}({json.dumps(call.input, ensure_ascii=False)[:160]})",
        tool=call.name,
        call_id=call.id,
    )


def _block(record: ToolCallRecord, message: str) -> None:
    record.status = "blocked"
    record.result_text = message
    record.is_error = True


def _on_loop(out: Outbox, record: ToolCallRecord, kind: str, reflection: str) -> None:
    s = out.state
    s.loop_reflections += 1
    _block(record, reflection)
    out.add(
        S.failure("loop", record.tool),
        RunEvent(
            run_id=s.run_id,
            kind="loop",
            iteration=s.iteration.n,
            summary=reflection,
            detail={"pattern": kind, "call_id": record.call_id, "reflections": s.loop_reflections},
        ),
        f"{s.run_id}.loop.{record.call_id}",
    )
    if s.loop_reflections > MAX_LOOP_REFLECTIONS:
        if s.config.loop_policy == "escalate":
            _escalate(
                out,
                S.kv_key(f"esc-{s.run_id}-loop-{s.iteration.n}"),
                "loop",
                f"the model keeps looping ({kind}) after a reflection",
                record.tool,
                record.call_id,
            )
        else:
            s.iteration.guard = f"loop persisted after {MAX_LOOP_REFLECTIONS} reflection(s): {kind}"


# --- tool outcomes ----------------------------------------------------------------------------


def apply_outcome(state: RunState, outcome: ToolOutcome) -> Outbox:
    out = Outbox(state)
    it = state.iteration
    record = next((c for c in it.tool_calls if c.call_id == outcome.call_id), None)
    if record is None or record.status != "dispatched" or state.done:
        return out  # stale or duplicate: nothing to do
    cfg = state.config
    record.outcome = outcome
    text, is_error = C.render_outcome(outcome, cfg.max_tool_result_tokens)
    record.result_text, record.is_error = text, is_error
    tool = outcome.requested_tool
    stats = state.corrections.setdefault(tool, {"failures": 0, "recovered": 0, "escalated": 0})

    if outcome.success:
        record.status = "succeeded"
        if state.schema_streak.get(tool, 0) > 0:
            stats["recovered"] += 1
            out.event(
                "corrected", f"{tool}: the model corrected a schema failure", tool=tool, after=state.schema_streak[tool]
            )
        state.schema_streak[tool] = 0
        if record.terminal:
            state.last_submission = dict(record.arguments)
        out.event(
            "tool_succeeded",
            f"{outcome.tool} ok" + (" (repaired)" if outcome.repaired else ""),
            tool=outcome.tool,
            call_id=record.call_id,
            repaired=outcome.repaired,
            cached=outcome.cached,
            fallback=outcome.fallback_from.to_tool if outcome.fallback_from else None,
        )
    else:
        record.status = "failed"
        ftype = outcome.failure_type or "fatal"
        out.event(
            "tool_failed",
            f"{outcome.tool} failed ({ftype}): {(outcome.error or '')[:160]}",
            tool=outcome.tool,
            call_id=record.call_id,
            failure_type=ftype,
        )
        state.error_history.append(error_key(tool, outcome.error or ftype))
        if ftype in ("input_invalid", "output_invalid"):
            stats["failures"] += 1
            state.schema_streak[tool] = state.schema_streak.get(tool, 0) + 1
            if state.schema_streak[tool] > cfg.max_schema_corrections:
                stats["escalated"] += 1
                _escalate(
                    out,
                    escalation_id_for_call(state.run_id, it.n, record.call_id) + "-schema",
                    "schema_cap",
                    f"'{tool}' failed its contract {state.schema_streak[tool]} times in a row "
                    f"(cap {cfg.max_schema_corrections}): {outcome.error}",
                    tool,
                    record.call_id,
                    failure_type=ftype,  # which contract broke (input or output), not only that a cap was reached
                )
                record.status = "awaiting_human"
        elif ftype in ("fatal", "unknown_outcome"):
            # The escalation service raises these itself from its failure subscription.
            record.status = "awaiting_human"
            _await(
                out,
                escalation_id_for_call(state.run_id, it.n, record.call_id),
                ftype,
                outcome.error or ftype,
                record.call_id,
            )
        elif outcome.boundary == "skip_and_note":
            record.status = "skipped"
            record.is_error = False
            record.result_text = (
                f"[{tool} skipped] {outcome.error} Continue without it and mention in your answer "
                "that this information is missing."
            )
        elif outcome.boundary == "ask_human":
            record.status = "awaiting_human"
            _escalate(
                out,
                escalation_id_for_call(state.run_id, it.n, record.call_id),
                "ask_human",
                f"'{tool}' failed and its boundary asks a human: {outcome.error}",
                tool,
                record.call_id,
            )
        finding = check_errors(state.error_history, threshold=cfg.loop_repeat_threshold)
        if finding is not None and record.status == "failed":
            state.error_history.clear()
            state.loop_reflections += 1
            it.notes.append(finding.reflection)
            out.add(
                S.failure("loop", tool),
                RunEvent(
                    run_id=state.run_id,
                    kind="loop",
                    iteration=it.n,
                    summary=finding.reflection,
                    detail={"pattern": finding.kind},
                ),
                f"{state.run_id}.loop.err.{record.call_id}",
            )
            if state.loop_reflections > MAX_LOOP_REFLECTIONS and cfg.loop_policy == "stop":
                it.guard = f"loop persisted after a reflection: {finding.kind}"
    if not it.pending and state.awaiting is None:
        _finish_iteration(out)
    return out


# --- escalations ------------------------------------------------------------------------------


def _await(out: Outbox, escalation_id: str, kind: str, reason: str, call_id: str | None) -> None:
    s = out.state
    s.status = "awaiting_human"
    s.awaiting = Awaiting(escalation_id=escalation_id, kind=kind, call_id=call_id, reason=reason)
    out.event("escalated", f"waiting for a human ({kind}): {reason[:200]}", escalation_id=escalation_id, kind=kind)


def _escalate(
    out: Outbox, escalation_id: str, kind: str, reason: str, tool: str | None, call_id: str | None, **details: Any
) -> None:
    s = out.state
    out.add(
        S.ESCALATION_RAISE,
        EscalationRaise(
            escalation_id=escalation_id,
            run_id=s.run_id,
            kind=kind,
            reason=reason,
            tool=tool,
            call_id=call_id,
            details=details,
        ),
        f"{s.run_id}.esc.{escalation_id}",
    )
    _await(out, escalation_id, kind, reason, call_id)


def apply_resolution(state: RunState, res: EscalationResolution) -> Outbox:
    out = Outbox(state)
    if state.awaiting is None or state.awaiting.escalation_id != res.escalation_id or state.done:
        return out
    awaiting = state.awaiting
    state.awaiting = None
    state.status = "running"
    out.event(
        "resumed",
        f"human {res.resolved_by}: {res.action} {res.note[:160]}",
        action=res.action,
        escalation_id=res.escalation_id,
    )
    who = f"the SLA ({res.note})" if res.by_sla else res.resolved_by
    if res.action == "abort":
        _finish(out, "stopped", f"aborted by {who}: {res.note or awaiting.reason}")
        return out
    it = state.iteration
    if res.action == "final_answer":  # a person wrote the answer: the run ends with it, completed
        answer = res.result if isinstance(res.result, str) else json.dumps(res.result, ensure_ascii=False)
        human = Candidate(id=f"{state.run_id}-human{it.n}", iteration=it.n, kind="text", content=answer)
        state.last_answer = answer
        _finish(out, "completed", f"final answer provided by {who}", accepted=human)
        return out
    if awaiting.kind in ("approval", "spawn"):  # a gate: yes continues, no tells the model it was denied
        it.notes.append(
            f"A human {'approved' if res.action in ('approve', 'accept') else 'denied'} this: {res.note or 'no note'}"
        )
        if not it.pending:
            _finish_iteration(out)
        return out
    if awaiting.kind == "not_judged":
        if res.action in ("accept", "approve") and it.verdict is not None:
            it.verdict = it.verdict.model_copy(  # a person judged it: say so, do not pass it off as the judge's
                update={
                    "status": "passed",
                    "score": 1.0,
                    "not_judged_reason": None,
                    "judge_model": f"human:{res.resolved_by}",
                    "reasons": [f"accepted by {res.resolved_by}: {res.note}"],
                }
            )
            _decide(out)
        else:
            it.notes.append(f"A reviewer asks for a revision: {res.note}")
            _decide(out, force_failed=True)
        return out
    record = next((c for c in it.tool_calls if c.call_id == awaiting.call_id), None)
    if record is not None:
        record.status = "resolved_by_human"
        if res.action == "provide_result":
            record.result_text = C.render_data(res.result, state.config.max_tool_result_tokens)
            record.is_error = False
            if record.terminal and isinstance(record.arguments, dict):
                state.last_submission = dict(record.arguments)
        elif res.action == "retry":  # the call stays failed; the model gets the human's instruction
            prefix = record.result_text or ""
            record.result_text = f"{prefix}\nA human asks you to try again: {res.note}".strip()
            record.is_error = True
        else:
            prefix = record.result_text or ""
            record.result_text = f"{prefix}\nA human reviewed this failure and says: {res.note or 'continue'}".strip()
        if awaiting.kind == "schema_cap" and record.tool in state.schema_streak:
            state.schema_streak[record.tool] = 0
    elif awaiting.kind == "loop":
        state.loop_reflections = 0
        it.notes.append(f"A human reviewed the loop and says: {res.note or 'try a different approach'}")
    if not it.pending:
        _finish_iteration(out)
    return out


# --- judging and deciding ---------------------------------------------------------------------


def _finish_iteration(out: Outbox) -> None:
    s, it = out.state, out.state.iteration
    submitted = [c for c in it.tool_calls if c.terminal and c.status in ("succeeded", "resolved_by_human")]
    if submitted:
        s.submitted = True  # read from the tool-call history: the terminal tool really ran
    if submitted and it.candidate is None:
        payload = submitted[-1].arguments
        content = _submission_text(payload)
        it.candidate = Candidate(
            id=f"{s.run_id}-c{it.n}", iteration=it.n, kind="submission", content=content, payload=payload
        )
        if content.strip():
            s.last_answer = content
    rubric = s.config.rubric
    if it.candidate is not None and rubric is not None and not it.judge_requested and it.guard is None:
        it.judge_requested = True
        history = (
            [f"{c.tool}({json.dumps(c.arguments, ensure_ascii=False)[:200]}) -> {c.status}" for c in it.tool_calls]
            if "tool_history" in rubric.judge_sees
            else []
        )
        out.add(
            S.JUDGE_SCORE,
            JudgeRequest(
                run_id=s.run_id,
                candidate=it.candidate,
                task=s.task,
                rubric=rubric,
                judge_seq=s.judge_seq,
                scripted=s.config.scripted,
                tool_history=history,
            ),
            f"{s.run_id}.judge.{it.candidate.id}",
        )
        s.judge_seq += 1
        out.event(
            "judge_requested",
            f"candidate {it.candidate.id} ({len(it.candidate.content)} chars) sent to the judge",
            candidate_id=it.candidate.id,
        )
        return
    _decide(out)


def _submission_text(payload: dict[str, Any]) -> str:
    """The submitted answer as text: the ``answer`` field, then any other fields labelled."""
    answer = payload.get("answer")
    if not isinstance(answer, str):
        return json.dumps(payload, ensure_ascii=False)
    rest = []
    for key, value in payload.items():
        if key == "answer":
            continue
        shown = "\n".join(f"- {v}" for v in value) if isinstance(value, list) else json.dumps(value, ensure_ascii=False)
        rest.append(f"{key.capitalize()}:\n{shown}" if isinstance(value, list) else f"{key.capitalize()}: {shown}")
    return "\n\n".join([answer, *rest])


def apply_verdict(state: RunState, verdict: Verdict) -> Outbox:
    out = Outbox(state)
    it = state.iteration
    fresh = (
        it.candidate is not None
        and verdict.candidate_id == it.candidate.id
        and it.verdict is None
        and it.judge_requested
        and not state.done
        and state.awaiting is None
    )
    if not fresh:
        out.event("verdict_ignored", f"verdict for {verdict.candidate_id} is not for the current candidate")
        return out
    it.verdict = verdict
    if verdict.status != "not_judged" and state.first_draft_passed is None:
        state.first_draft_passed = verdict.status == "passed"
    if verdict.status == "failed":
        state.judge_failures.extend(
            f"{c.name}: {c.reason}" if c.reason else f"{c.name} scored {c.score:.2f}"
            for c in verdict.criteria
            if not c.passed or c.score < 1.0
        )
    out.event(
        "judged",
        _verdict_summary(verdict),
        status=verdict.status,
        score=verdict.score,
        candidate_id=verdict.candidate_id,
        criteria={c.name: c.score for c in verdict.criteria},
    )
    if verdict.status == "not_judged":
        out.add(
            S.failure("judge", None),
            RunEvent(run_id=state.run_id, kind="not_judged", iteration=it.n, summary=verdict.not_judged_reason or ""),
            f"{state.run_id}.notjudged.{verdict.candidate_id}",
        )
        policy = state.config.not_judged_policy
        if policy == "escalate":
            _escalate(
                out,
                S.kv_key(f"esc-{state.run_id}-{verdict.candidate_id}"),
                "not_judged",
                f"the judge could not score the candidate: {verdict.not_judged_reason}",
                None,
                None,
                candidate=it.candidate.content[:2000] if it.candidate else "",
            )
            return out
        if policy == "fail":
            _finish(out, "failed", f"the candidate could not be judged: {verdict.not_judged_reason}")
            return out
    _decide(out)
    return out


def _verdict_summary(v: Verdict) -> str:
    if v.status == "not_judged":
        return f"not judged: {v.not_judged_reason}"
    return f"{v.status}: score {v.score:.2f} (threshold {v.threshold:.2f})"


def _effective_verdict(s: RunState) -> str | None:
    v = s.iteration.verdict
    if v is None:
        return None
    if v.status == "not_judged":
        return "failed" if s.config.not_judged_policy == "retry" else None
    return v.status


def facts_for(s: RunState, force_failed: bool = False) -> IterationFacts:
    it = s.iteration
    terminal_ran = any(c.terminal and c.status in ("succeeded", "resolved_by_human") for c in it.tool_calls)
    non_terminal = [c for c in it.tool_calls if not c.terminal or c.status not in ("succeeded", "resolved_by_human")]
    return IterationFacts(
        guard_blocked=it.guard is not None,
        tool_results_pending=bool(non_terminal) and not terminal_ran,
        verdict="failed" if force_failed else _effective_verdict(s),  # type: ignore[arg-type]
        retries_used=s.retry_count,
        max_retries=s.config.max_judge_retries,
        terminal_tool_ran=terminal_ran,
        answer_produced=it.candidate is not None,
    )


def _decide(out: Outbox, force_failed: bool = False) -> None:
    s, it = out.state, out.state.iteration
    decision = decide(facts_for(s, force_failed))
    it.decision = DecisionRecord(action=decision.action.value, row=decision.row, reason=decision.reason)
    out.event(
        "decided",
        f"row {decision.row}: {decision.action.value} — {decision.reason}",
        action=decision.action.value,
        row=decision.row,
    )
    if decision.action is Action.COMPLETE:
        if it.guard is not None:
            _finish(out, "stopped", f"guard: {it.guard}")
        else:
            passed = None if it.verdict is None or it.verdict.status == "not_judged" else it.verdict.status == "passed"
            reason = decision.reason if decision.row != 4 else "judge retries spent; kept the current answer"
            _finish(out, "completed", reason, passed=passed, accepted=it.candidate)
        return
    notes = list(it.notes)
    if decision.action is Action.RETRY:
        s.retry_count += 1
        notes.append(retry_guidance(it.verdict, s.config.answer_mode, s.config.terminal_tools))
        kind = "retry"
    else:
        s.continue_count += 1
        kind = "work" if decision.row == 2 else "synthesis"
        if decision.row == 6:
            notes.append(_synthesis_nudge(s))
    closing = C.closing_user_message(it.tool_calls, notes)
    if closing is not None:
        s.messages.append(closing)
    _start_iteration(out, kind)


def retry_guidance(verdict: Verdict | None, mode: str, terminal: list[str]) -> str:
    """What the retry turn says: the failed criteria and reasons. It never forbids tools."""
    if verdict is None:
        return "Your answer was not accepted. Revise it."
    lines = []
    if verdict.score is not None:
        lines.append(f"A reviewer scored your answer {verdict.score:.2f}; it needs {verdict.threshold:.2f}.")
    else:
        lines.append(f"Your answer could not be scored: {verdict.not_judged_reason}.")
    failed = [c for c in verdict.criteria if not c.passed or c.score < 1.0]
    if failed:
        lines.append("Criteria to improve:")
        lines.extend(
            f"- {c.name} ({c.score:.2f}{', required' if c.hard else ''}): {c.reason or 'not met'}" for c in failed
        )
    lines.extend(f"- {r}" for r in verdict.reasons if r and not any(r.startswith(c.name) for c in failed))
    finish = (
        f"then call {terminal[0]} with the revised answer"
        if mode != "text" and terminal
        else "then reply with the revised answer"
    )
    lines.append(f"Revise the answer to address these points. Use tools again if you need more information, {finish}.")
    return "\n".join(lines)


def _synthesis_nudge(s: RunState) -> str:
    if s.config.answer_mode == "text":
        return "Please write your final answer now, as plain text."
    return (
        f"You have not submitted an answer yet. When you have what you need, call "
        f"{s.config.terminal_tools[0]} with your answer."
    )


def _start_iteration(out: Outbox, kind: str) -> None:
    s = out.state
    n = s.iteration.n + 1
    s.iteration = Iteration(n=n, kind=kind)  # a fresh iteration: no candidate, no score
    if n > s.config.max_iterations:
        s.iteration.guard = f"max iterations ({s.config.max_iterations}) reached"
        _decide(out)
        return
    if s.usage.cost_usd >= s.config.cost_ceiling_usd:
        s.iteration.guard = f"cost ceiling ${s.config.cost_ceiling_usd:.2f} reached (spent ${s.usage.cost_usd:.4f})"
        out.add(
            S.failure("budget", None),
            RunEvent(run_id=s.run_id, kind="guard.cost", iteration=n, summary=s.iteration.guard),
            f"{s.run_id}.guard.cost.{n}",
        )
        _decide(out)
        return
    _advance(out)


def _finish(
    out: Outbox, status: str, reason: str, passed: bool | None = None, accepted: Candidate | None = None
) -> None:
    s = out.state
    s.status = status  # type: ignore[assignment]
    s.final_reason = reason
    s.passed = passed
    s.final_output = final_output(s, accepted)
    out.event(
        status,
        f"{status}: {reason}",
        final_output=s.final_output,
        submitted=s.submitted,
        passed=passed,
        first_draft_passed=s.first_draft_passed,
        iterations=s.iteration.n,
        continues=s.continue_count,
        retries=s.retry_count,
        usage=s.usage.model_dump(),
    )


def final_output(s: RunState, accepted: Candidate | None) -> str:
    """Never empty when something was produced: the accepted candidate, else the last
    non-empty answer, else the last non-empty text, else the last submitted payload."""
    if accepted is not None and accepted.content.strip():
        return accepted.content
    if s.last_answer.strip():
        return s.last_answer
    if s.last_text.strip():
        return s.last_text
    if s.last_submission:
        return _submission_text(s.last_submission)
    return ""


def apply_compaction(state: RunState, older_count: int, summary: str, usage: Usage) -> None:
    """Replace the older part of the conversation with a summary (recent turns stay verbatim)."""
    older, recent = C.split_for_compaction(state.messages, state.config.keep_recent_turns)
    if not older or len(older) != older_count:
        return
    state.usage = state.usage + usage
    state.compactions += 1
    state.summary = summary
    head = recent[0]
    note = TextBlock(text=f"Summary of earlier work (older turns were compacted to save context):\n{summary}")
    state.messages = [ChatMessage(role="user", content=[*head.content, note]), *recent[1:]]
