"""Rubric scoring (pure): weighted partial credit, hard criteria, and no fail-open scores.

Each criterion gets 0.0-1.0; the score is the weighted average; a hard criterion below its
``pass_at`` forces the score to 0. A reply that cannot be parsed, that skips a criterion,
or that gives an out-of-range number is *not judged* — a reason, never a default score.
Criterion names stay exactly as written, in any language.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from shared.messages import CriterionScore, JudgeRequest, Rubric, Usage, Verdict

JUDGE_SYSTEM = """You are a strict reviewer. Score the candidate answer against each criterion with a number from
0.0 (not met at all) to 1.0 (fully met). Judge only from the task and the candidate shown to you.
Reply with one JSON object and nothing else:
{"scores": {"<criterion name>": <number>, ...}, "reasons": {"<criterion name>": "<one sentence>", ...}}
Use the criterion names exactly as given."""


def judge_prompt(req: JudgeRequest) -> str:
    criteria = "\n".join(
        f"- {c.name}" + (f": {c.description}" if c.description else "") + (" (required)" if c.hard else "")
        for c in req.rubric.criteria
    )
    parts = []
    if "task" in req.rubric.judge_sees:
        parts.append(f"Task:\n{req.task}")
    label = "Submitted payload" if req.candidate.kind == "submission" else "Candidate answer"
    body = (
        json.dumps(req.candidate.payload, ensure_ascii=False, indent=2)
        if req.candidate.payload
        else req.candidate.content
    )
    parts.append(f"{label}:\n{body}")
    if req.tool_history:
        parts.append("Tool calls made:\n" + "\n".join(f"- {h}" for h in req.tool_history))
    parts.append(f"Criteria:\n{criteria}")
    return "\n\n".join(parts)


@dataclass(frozen=True)
class Parsed:
    scores: dict[str, float]
    reasons: dict[str, str]


class NotJudged(Exception):
    """The reply cannot be turned into scores; the message says why."""


_FENCE = re.compile(r"```(?:json)?\s*(\{.*?\})\s*```", re.S)


def _json_object(text: str) -> dict[str, Any]:
    candidates = [m.group(1) for m in _FENCE.finditer(text)]
    start = text.find("{")
    if start >= 0:
        candidates.append(text[start : text.rfind("}") + 1])
    for chunk in candidates:
        try:
            value = json.loads(chunk)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    raise NotJudged(f"the judge's reply is not a JSON object: {text[:160]!r}")


def parse_reply(text: str, rubric: Rubric) -> Parsed:
    obj = _json_object(text)
    raw_scores = obj.get("scores", obj)
    if not isinstance(raw_scores, dict):
        raise NotJudged("the judge's reply has no 'scores' object")
    reasons_obj = obj.get("reasons", {})
    reasons = {str(k): str(v) for k, v in reasons_obj.items()} if isinstance(reasons_obj, dict) else {}
    scores: dict[str, float] = {}
    for c in rubric.criteria:
        if c.name not in raw_scores:
            raise NotJudged(f"the judge gave no score for criterion '{c.name}'")
        value = raw_scores[c.name]
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise NotJudged(f"the score for '{c.name}' is not a number: {value!r}")
        if not 0.0 <= value <= 1.0:
            raise NotJudged(f"the score for '{c.name}' is outside 0.0-1.0: {value!r}")
        scores[c.name] = float(value)
    return Parsed(scores, reasons)


def score(req: JudgeRequest, parsed: Parsed, judge_model: str, usage: Usage) -> Verdict:
    rubric = req.rubric
    results: list[CriterionScore] = []
    hard_failures: list[str] = []
    for c in rubric.criteria:
        s = parsed.scores[c.name]
        passed = s >= c.pass_at if c.hard else True
        if not passed:
            hard_failures.append(c.name)
        results.append(
            CriterionScore(
                name=c.name, score=s, weight=c.weight, hard=c.hard, passed=passed, reason=parsed.reasons.get(c.name, "")
            )
        )
    total_weight = sum(c.weight for c in rubric.criteria)
    weighted = sum(r.score * r.weight for r in results) / total_weight
    reasons = [f"{r.name}: {r.reason}" for r in results if r.reason and r.score < 1.0]
    if hard_failures:
        weighted = 0.0
        reasons.insert(0, "required criteria not met: " + ", ".join(hard_failures))
    status = "passed" if weighted >= rubric.threshold and not hard_failures else "failed"
    return Verdict(
        run_id=req.run_id,
        candidate_id=req.candidate.id,
        iteration=req.candidate.iteration,
        status=status,
        score=round(weighted, 4),
        threshold=rubric.threshold,
        criteria=results,
        reasons=reasons,
        judge_model=judge_model,
        usage=usage,
    )


def not_judged(req: JudgeRequest, reason: str, judge_model: str, usage: Usage | None = None) -> Verdict:
    return Verdict(
        run_id=req.run_id,
        candidate_id=req.candidate.id,
        iteration=req.candidate.iteration,
        status="not_judged",
        score=None,
        threshold=req.rubric.threshold,
        not_judged_reason=reason,
        judge_model=judge_model,
        usage=usage or Usage(),
    )
