"""Judge scoring: weighted partial credit, hard criteria, and 'not judged' instead of made-up scores."""

from __future__ import annotations

import pytest

from services.judge.scoring import NotJudged, parse_reply, score
from shared.messages import Candidate, JudgeRequest, Rubric, Usage

RUBRIC = Rubric.model_validate(
    {
        "threshold": 0.8,
        "criteria": [
            {"name": "정확성", "weight": 2},
            {"name": "출처 인용", "weight": 1, "hard": True},
            {"name": "concise"},
        ],
    }
)


def request(rubric: Rubric = RUBRIC) -> JudgeRequest:
    return JudgeRequest(
        run_id="r",
        candidate=Candidate(id="r-c1", iteration=1, kind="text", content="answer"),
        task="t",
        rubric=rubric,
    )


def verdict(reply: str):  # type: ignore[no-untyped-def]
    return score(request(), parse_reply(reply, RUBRIC), "judge-model", Usage())


def test_weighted_partial_credit() -> None:
    v = verdict('{"scores": {"정확성": 0.9, "출처 인용": 1.0, "concise": 0.5}}')
    assert v.score == pytest.approx((0.9 * 2 + 1.0 + 0.5) / 4)
    assert v.status == "passed"


def test_a_failed_hard_criterion_forces_zero_and_keeps_names_as_written() -> None:
    v = verdict('{"scores": {"정확성": 1.0, "출처 인용": 0.2, "concise": 1.0}, "reasons": {"출처 인용": "URL 없음"}}')
    assert v.score == 0.0 and v.status == "failed"
    assert [c.name for c in v.criteria] == ["정확성", "출처 인용", "concise"]
    assert v.reasons[0] == "required criteria not met: 출처 인용"
    assert "출처 인용: URL 없음" in v.reasons


def test_below_threshold_fails() -> None:
    assert verdict('{"scores": {"정확성": 0.6, "출처 인용": 1.0, "concise": 0.6}}').status == "failed"


def test_fenced_json_and_flat_scores_parse() -> None:
    assert verdict('Here you go:\n```json\n{"scores": {"정확성": 1, "출처 인용": 1, "concise": 1}}\n```').score == 1.0
    assert verdict('{"정확성": 1, "출처 인용": 1, "concise": 0}').score == 0.75


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        ("I think it is fine", "not a JSON object"),
        ('{"scores": {"정확성": 0.9, "concise": 1}}', "no score for criterion '출처 인용'"),
        ('{"scores": {"정확성": 9, "출처 인용": 1, "concise": 1}}', "outside 0.0-1.0"),
        ('{"scores": {"정확성": "high", "출처 인용": 1, "concise": 1}}', "not a number"),
        ('{"scores": {"정확성": true, "출처 인용": 1, "concise": 1}}', "not a number"),
        ('{"scores": {"정확성": NaN, "출처 인용": 1, "concise": 1}}', "not a number"),
        ('{"scores": [1, 1, 1]}', "no 'scores' object"),
    ],
)
def test_unusable_replies_are_not_judged_never_scored(reply: str, why: str) -> None:
    with pytest.raises(NotJudged, match=why):
        parse_reply(reply, RUBRIC)
