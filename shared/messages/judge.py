"""The judge's contracts: a rubric (a run's or an agent's), a candidate sent to be judged and the verdict."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from shared.messages.conversation import Usage
from shared.messages.wire import CallId, RunId, Wire

# --- rubric -----------------------------------------------------------------------------------

JudgeInput = Literal["task", "answer", "tool_history"]


class Criterion(Wire):
    name: str = Field(min_length=1, description="kept exactly as written, in any language")
    weight: float = Field(1.0, gt=0)
    hard: bool = Field(False, description="a failed hard criterion forces the score to 0")
    pass_at: float = Field(0.5, ge=0, le=1, description="a hard criterion fails below this score")
    description: str | None = None
    needs: list[JudgeInput] = Field(
        default_factory=list, description="what the judge must see to decide this criterion"
    )


class Rubric(Wire):
    criteria: list[Criterion] = Field(min_length=1)
    threshold: float = Field(0.8, ge=0, le=1)
    judge_sees: list[JudgeInput] = Field(default_factory=lambda: list[JudgeInput](["task", "answer"]))

    @field_validator("criteria")
    @classmethod
    def _unique(cls, v: list[Criterion]) -> list[Criterion]:
        names = [c.name for c in v]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"criterion names must be unique; repeated: {', '.join(dupes)}")
        return v


# --- judge ------------------------------------------------------------------------------------


class Candidate(Wire):
    id: CallId
    iteration: int
    kind: Literal["text", "submission"]
    content: str
    payload: dict[str, Any] | None = None


class JudgeRequest(Wire):
    run_id: RunId
    candidate: Candidate
    task: str
    rubric: Rubric
    judged_before: int = Field(0, ge=0, description="candidates of this run sent to the judge before this one")
    tool_history: list[str] = Field(default_factory=list)


class CriterionScore(Wire):
    name: str
    score: float = Field(ge=0, le=1)
    weight: float
    hard: bool = False
    passed: bool = True
    reason: str = ""


class Verdict(Wire):
    run_id: RunId
    candidate_id: CallId
    iteration: int
    status: Literal["passed", "failed", "not_judged"]
    score: float | None = None
    threshold: float
    criteria: list[CriterionScore] = Field(default_factory=list)
    reasons: list[str] = Field(default_factory=list)
    not_judged_reason: str | None = None
    judge_model: str = ""
    usage: Usage = Field(default_factory=Usage)
    judge_provider: str = Field(
        "",
        max_length=64,
        description="the provider that judged (anthropic, openai, scripted: a scenario's replay); lessons are kept "
        "from a live provider's reasons only ('': a judge that does not say)",
    )

    @model_validator(mode="after")
    def _no_score_when_not_judged(self) -> Verdict:
        if self.status == "not_judged" and (self.score is not None or not self.not_judged_reason):
            raise ValueError("a not_judged verdict carries a reason and no score")
        if self.status != "not_judged" and self.score is None:
            raise ValueError("a judged verdict carries a score")
        return self
