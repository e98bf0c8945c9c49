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


class LeasedCall(Wire):
    """A model call the planner made on a lease (no request of its own): what the governor learns its
    calibration from when the planner next asks (the prompt it counted, the usage the provider reported)."""

    turn: int
    prompt_tokens: int = Field(ge=0, description="the call's goal + history + tools sections, uncalibrated")
    usage: Usage


LEASED_CALLS_MAX = 64  # the longest lease (``LW_BUDGET_LEASE_TURNS``) is at most this many turns


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
    leased: list[LeasedCall] = Field(
        default_factory=list,
        max_length=LEASED_CALLS_MAX,
        description="the calls made on the last decision's lease since, oldest first (none kept: not known)",
    )


class BudgetLease(Wire):
    """Later turns of the run the planner may take without asking, each as an ``allow`` with the decision's
    model and reply size: the governor checked its own rule at the corner of these bounds (every section
    but the history as in the request, the history, the run's spent tokens and its spent cost at most
    these), and the rule only tightens as they grow. A turn outside them, a wrap-up turn, or one after
    ``until_turn`` or ``expires_in_s`` asks again."""

    until_turn: int = Field(description="the last turn the lease covers")
    expires_in_s: float = Field(gt=0, description="how long after the answer the lease lasts")
    max_history_tokens: int = Field(ge=0, description="the history section, uncalibrated, at most")
    max_spent_tokens: int = Field(ge=0, description="the run's input + output tokens so far, at most")
    max_spent_usd: float = Field(ge=0, description="the run's cost so far, at most")


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
    lease: BudgetLease | None = Field(None, description="later turns allowed without asking, within bounds")
