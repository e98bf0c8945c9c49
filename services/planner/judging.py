"""Judging and deciding: the end of an iteration.

An iteration ends when its tool calls are settled: its candidate (a text answer or a terminal
tool's submission) goes to the judge when the run has a rubric, and the verdict (or no
candidate, or a guard) feeds the Decide table (``decide.py``), whose action completes the run
or starts the next iteration.
"""

from __future__ import annotations

import json

from services.planner import context as C
from services.planner import ids
from services.planner.decide import Action, IterationFacts, decide
from services.planner.outbox import Outbox, advance, escalate, finish, submission_text
from services.planner.state import DecisionRecord, Iteration, RunState
from shared import subjects as S
from shared.messages import (
    Candidate,
    CandidateDetail,
    Decided,
    DecidedDetail,
    GuardTripped,
    Judged,
    JudgedDetail,
    JudgeRequest,
    JudgeRequested,
    NotJudged,
    NotJudgedDetail,
    ReasonDetail,
    Verdict,
    VerdictIgnored,
)
from shared.providers.select import AUTO_ORDER as LIVE_JUDGES  # the live providers (a judge that is not scripted)


def finish_iteration(out: Outbox) -> None:
    """The iteration's calls are settled: send its candidate to the judge, or decide."""
    s, it = out.state, out.state.iteration
    submitted = [c for c in it.tool_calls if c.terminal and c.status in ("succeeded", "resolved_by_human")]
    if submitted:
        s.submitted = True  # read from the tool-call history: the terminal tool really ran
    if submitted and it.candidate is None:
        payload = submitted[-1].arguments
        content = submission_text(payload)
        it.candidate = Candidate(
            id=ids.candidate(s.run_id, it.n), iteration=it.n, kind="submission", content=content, payload=payload
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
                judged_before=s.judge_seq,
                tool_history=history,
            ),
            ids.judge_request(s.run_id, it.candidate.id),
        )
        s.judge_seq += 1
        out.event(
            JudgeRequested(
                **out.head(f"candidate {it.candidate.id} ({len(it.candidate.content)} chars) sent to the judge"),
                detail=CandidateDetail(candidate_id=it.candidate.id),
            )
        )
        return
    decide_next(out)


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
        out.event(
            VerdictIgnored(
                **out.head(f"verdict for {verdict.candidate_id} is not for the current candidate"),
                detail=CandidateDetail(candidate_id=verdict.candidate_id),
            )
        )
        return out
    it.verdict = verdict
    if not state.first_draft_judged:  # the run's first candidate is its first draft, judged or not
        state.first_draft_judged = True
        state.first_draft_passed = None if verdict.status == "not_judged" else verdict.status == "passed"
    if verdict.status == "failed" and verdict.judge_provider in LIVE_JUDGES:  # a live judge's reasons only: lessons
        state.judge_failures.extend(
            f"{c.name}: {c.reason}" if c.reason else f"{c.name} scored {c.score:.2f}"
            for c in verdict.criteria
            if not c.passed or c.score < 1.0
        )
    out.event(
        Judged(
            **out.head(_verdict_summary(verdict)),
            detail=JudgedDetail(
                status=verdict.status,
                score=verdict.score,
                candidate_id=verdict.candidate_id,
                criteria={c.name: c.score for c in verdict.criteria},
            ),
        )
    )
    if verdict.status == "not_judged":
        out.add(
            S.failure("judge", None),
            NotJudged(
                **out.head(verdict.not_judged_reason or ""),
                detail=NotJudgedDetail(candidate_id=verdict.candidate_id, reason=verdict.not_judged_reason or ""),
            ),
            ids.not_judged(state.run_id, verdict.candidate_id),
        )
        policy = state.config.not_judged_policy
        if policy == "escalate":
            escalate(
                out,
                ids.not_judged_escalation(state.run_id, verdict.candidate_id),
                "not_judged",
                f"the judge could not score the candidate: {verdict.not_judged_reason}",
                None,
                None,
                candidate=it.candidate.content[:2000] if it.candidate else "",
            )
            return out
        if policy == "fail":
            finish(out, "failed", f"the candidate could not be judged: {verdict.not_judged_reason}")
            return out
    decide_next(out)
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


def decide_next(out: Outbox, force_failed: bool = False) -> None:
    """Run the Decide table on this iteration and act on its row."""
    s, it = out.state, out.state.iteration
    decision = decide(facts_for(s, force_failed))
    it.decision = DecisionRecord(action=decision.action.value, row=decision.row, reason=decision.reason)
    out.event(
        Decided(
            **out.head(f"row {decision.row}: {decision.action.value} — {decision.reason}"),
            detail=DecidedDetail(action=decision.action.value, row=decision.row),
        )
    )
    if decision.action is Action.COMPLETE:
        if it.guard is not None:
            finish(out, "stopped", f"guard: {it.guard}")
        else:
            passed = None if it.verdict is None or it.verdict.status == "not_judged" else it.verdict.status == "passed"
            reason = decision.reason if decision.row != 4 else "judge retries spent; kept the current answer"
            finish(out, "completed", reason, passed=passed, accepted=it.candidate)
        return
    notes = list(it.notes)
    if decision.action is Action.RETRY:
        s.retry_count += 1
        notes.append(C.retry_guidance(it.verdict, s.config.answer_mode, s.config.terminal_tools))
        kind = "retry"
    else:
        s.continue_count += 1
        kind = "work" if decision.row == 2 else "synthesis"
        if decision.row == 6:
            notes.append(C.synthesis_nudge(s.config.answer_mode, s.config.terminal_tools))
    closing = C.closing_user_message(it.tool_calls, notes)
    if closing is not None:
        s.messages.append(closing)
    _start_iteration(out, kind)


def _start_iteration(out: Outbox, kind: str) -> None:
    s = out.state
    n = s.iteration.n + 1
    s.iteration = Iteration(n=n, kind=kind)  # a fresh iteration: no candidate, no score
    if n > s.config.max_iterations:
        s.iteration.guard = f"max iterations ({s.config.max_iterations}) reached"
        decide_next(out)
        return
    if n == s.config.max_iterations and n > 1:  # the last turn the cap allows: one answer, no tools
        s.iteration.wrap_up = f"max iterations ({s.config.max_iterations}) reached"
    if s.usage.cost_usd >= s.config.cost_ceiling_usd:
        s.iteration.guard = f"cost ceiling ${s.config.cost_ceiling_usd:.2f} reached (spent ${s.usage.cost_usd:.4f})"
        out.add(
            S.failure("budget", None),
            GuardTripped(
                **out.head(s.iteration.guard), kind="guard.cost", detail=ReasonDetail(reason=s.iteration.guard)
            ),
            ids.cost_guard(s.run_id, n),
        )
        decide_next(out)
        return
    advance(out)
