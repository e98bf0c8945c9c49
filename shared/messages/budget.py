"""The governor's contracts: a turn's budget request and its decision."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from shared.messages.conversation import Usage
from shared.messages.wire import Name, RunId, Wire


class SectionTokens(Wire):
    goal: int = 0
    history: int = 0
    tools: int = 0
    output: int = 0

    @property
    def total(self) -> int:
        return self.goal + self.history + self.tools + self.output


class BudgetRequest(Wire):
    run_id: RunId
    turn: int
    model: str = Field(max_length=128)
    sections: SectionTokens
    spent: Usage
    context_budget_tokens: int
    run_token_budget: int
    cost_ceiling_usd: float
    tenant: Name | None = None
    wrap_up: bool = Field(False, description="this turn is already the run's tool-less wrap-up turn")
    delegated_usd: float = Field(
        0.0, ge=0, description="the part of spent.cost_usd its sub-agents spent (each accounts its own to the tenant)"
    )


BudgetAction = Literal["allow", "warn", "compact", "block", "wrap_up"]


class BudgetDecision(Wire):
    run_id: RunId
    turn: int
    action: BudgetAction
    model: str
    max_output_tokens: int
    reasons: list[str] = Field(default_factory=list)
    fired: list[str] = Field(default_factory=list, description="thresholds that fired for the first time")
    allocations: dict[str, int] = Field(default_factory=dict)
    usage_ratio: float = 0.0
    calibration: float = Field(1.0, description="reported / estimated input tokens for this model, applied here")
    estimated_cost_usd: float = Field(0.0, description="what this call is expected to cost, at cache rates")
