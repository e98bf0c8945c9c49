"""Escalations: a human's resolution applied to the run that waits for it.

Raising an escalation and waiting are ``outbox.escalate`` / ``outbox.await_human`` (every phase
may do it); this module is what the answer does: abort, a person's final answer, a gate's yes or
no, a judgement in place of the judge, or a result, retry or note for the call that failed.
"""

from __future__ import annotations

import json
from typing import assert_never

from services.planner import context as C
from services.planner import delegation, ids
from services.planner.judging import decide_next, finish_iteration
from services.planner.outbox import Outbox, finish
from services.planner.stalls import apply_stall_resolution
from services.planner.state import Awaiting, RunState
from shared.messages import Candidate, EscalationResolution, Resumed, ResumedDetail


def apply_resolution(state: RunState, res: EscalationResolution) -> Outbox:
    if state.stall is not None and (state.awaiting is None or state.awaiting.escalation_id != res.escalation_id):
        return apply_stall_resolution(state, res)  # a stalled run's item: requeue its letter, or abort
    out = Outbox(state)
    if state.awaiting is None or state.awaiting.escalation_id != res.escalation_id or state.done:
        return out
    awaiting = state.awaiting
    state.awaiting = None
    state.status = "running"
    out.event(
        Resumed(
            **out.head(f"human {res.resolved_by}: {res.action} {res.note[:160]}"),
            detail=ResumedDetail(action=res.action, escalation_id=res.escalation_id),
        )
    )
    who = f"the SLA ({res.note})" if res.by_sla else res.resolved_by
    it = state.iteration
    match res.action:
        case "abort":
            finish(out, "stopped", f"aborted by {who}: {res.note or awaiting.reason}")
            return out
        case "final_answer":  # a person wrote the answer: the run ends with it, completed
            answer = res.result if isinstance(res.result, str) else json.dumps(res.result, ensure_ascii=False)
            human = Candidate(id=ids.human_candidate(state.run_id, it.n), iteration=it.n, kind="text", content=answer)
            state.last_answer = answer
            finish(out, "completed", f"final answer provided by {who}", accepted=human)
            return out
        case "approve" | "accept" | "reject" | "resume" | "provide_result" | "retry":
            _decide(out, awaiting, res)  # what it means depends on the kind of question
        case "requeue":  # only a stalled run's item offers it (above)
            pass
        case _:
            assert_never(res.action)
    return out


def _decide(out: Outbox, awaiting: Awaiting, res: EscalationResolution) -> None:
    """A yes or no, a judgement, a result, a retry or a note: its effect is the kind's."""
    state, it = out.state, out.state.iteration
    yes = res.action in ("approve", "accept")
    gated = next((c for c in it.tool_calls if c.call_id == awaiting.call_id), None) if awaiting.call_id else None
    if awaiting.kind == "spawn" and gated is not None and gated.tool == delegation.DELEGATE:
        # the sub-agent gate: yes starts the child, no is the delegate call's result
        delegation.resolve_gate(out, gated, yes, res.note)
        if not it.pending:
            finish_iteration(out)
        return
    if awaiting.kind in ("approval", "spawn"):  # a gate: yes continues, no tells the model it was denied
        it.notes.append(C.gate_note(yes, res.note))
        if not it.pending:
            finish_iteration(out)
        return
    if awaiting.kind == "not_judged":
        if yes and it.verdict is not None:
            it.verdict = it.verdict.model_copy(  # a person judged it: say so, do not pass it off as the judge's
                update={
                    "status": "passed",
                    "score": 1.0,
                    "not_judged_reason": None,
                    "judge_model": f"human:{res.resolved_by}",
                    "reasons": [f"accepted by {res.resolved_by}: {res.note}"],
                }
            )
            decide_next(out)
        else:
            it.notes.append(C.revision_request(res.note))
            decide_next(out, force_failed=True)
        return
    record = gated
    if record is not None:
        record.status = "resolved_by_human"
        match res.action:
            case "provide_result":
                record.result_text = C.render_data(res.result, state.config.max_tool_result_tokens)
                record.is_error = False
                if record.terminal and isinstance(record.arguments, dict):
                    state.last_submission = dict(record.arguments)
            case "retry":  # the call stays failed; the model gets the human's instruction
                record.result_text = C.human_retry(record.result_text, res.note)
                record.is_error = True
            case "resume" | "approve" | "accept" | "reject" | "abort" | "final_answer" | "requeue":
                record.result_text = C.human_review(record.result_text, res.note)
            case _:
                assert_never(res.action)
        if awaiting.kind == "schema_cap" and record.tool in state.schema_streak:
            state.schema_streak[record.tool] = 0
    elif awaiting.kind == "loop":
        it.notes.append(C.loop_review(res.note))
    if awaiting.kind == "loop":  # a human looked at the loop: the next one earns a reflection again
        state.loop_reflections = 0
    if not it.pending:
        finish_iteration(out)
