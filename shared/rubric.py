"""Rubric lint: a criterion must be decidable from what the judge actually sees.

A criterion that needs something the judge never receives ("includes the session id"
when the judge sees only the submitted payload) cannot pass; it is a retry generator, not
a quality bar. Criteria that *declare* what they need (``needs``) are refused when the
judge does not see it; criteria whose wording points at invisible things are flagged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from shared.messages import Rubric

# Wording that refers to things outside the candidate and the task (English and Korean).
_INVISIBLE: list[tuple[re.Pattern[str], str, str]] = [
    (re.compile(r"session[\s_-]*id|세션\s*(id|아이디)", re.I), "the session id", "answer"),
    (re.compile(r"\brun[\s_-]*id\b|실행\s*(id|아이디)", re.I), "the run id", "answer"),
    (re.compile(r"\btrace[\s_-]*id\b|\bspan\b", re.I), "trace data", "answer"),
    (
        re.compile(r"tool[\s_-]*calls?|called the|used the .* tool|도구\s*(호출|사용)", re.I),
        "the tool-call history",
        "tool_history",
    ),
    (re.compile(r"\blogs?\b|로그", re.I), "logs", "answer"),
    (
        re.compile(r"conversation|chat history|previous (turns|messages)|대화\s*(기록|내역)", re.I),
        "the conversation",
        "answer",
    ),
    (re.compile(r"latency|response time|how long|응답\s*시간", re.I), "timings", "answer"),
]


class RubricError(ValueError):
    pass


@dataclass
class RubricLint:
    errors: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)


def lint_rubric(rubric: Rubric) -> RubricLint:
    out = RubricLint()
    sees = set(rubric.judge_sees)
    for c in rubric.criteria:
        missing = [n for n in c.needs if n not in sees]
        if missing:
            out.errors.append(
                f"criterion '{c.name}' needs {', '.join(missing)} but the judge sees only {', '.join(sorted(sees))}"
            )
            continue
        text = f"{c.name} {c.description or ''}"
        for pattern, thing, would_need in _INVISIBLE:
            if (
                pattern.search(text)
                and would_need not in c.needs
                and (would_need != "tool_history" or would_need not in sees)
            ):
                out.flags.append(
                    f"criterion '{c.name}' refers to {thing}, which the judge does not receive "
                    f"(it sees: {', '.join(sorted(sees))}); it may never pass"
                )
                break
    if all(c.hard for c in rubric.criteria) and len(rubric.criteria) > 1:
        out.flags.append("every criterion is hard: any single miss scores 0, so near-misses and failures look alike")
    return out


def check_rubric(rubric: Rubric, *, strict: bool = False) -> list[str]:
    """Raise ``RubricError`` for criteria the judge cannot decide; return the softer flags."""
    found = lint_rubric(rubric)
    problems = found.errors + (found.flags if strict else [])
    if problems:
        raise RubricError("; ".join(problems))
    return found.flags
