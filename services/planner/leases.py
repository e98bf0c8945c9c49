"""A budget decision's lease as the planner holds it (``BudgetDecision.lease``; the governor's ``lease_for``
decides it): the run's later turns it allows without a request of their own, while the run stays inside its
bounds. No I/O.

A turn is taken on the lease only when its request, built and counted as for an ask (the real tokenizer, the
same sections), is one the governor's rule answers the same for: every section but the history as in the
request the lease was given on, the history and the run's spend within the bounds, the same model, tenant and
limits, not a wrap-up turn, the turn within ``until_turn`` and the lease not expired. Anything else asks, as
every turn did before. The calls made on a lease are reported with the next ask, for the governor's
calibration; a lease is held in memory only: a replica that restarts, or another replica that takes the
run's turn, simply asks.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field

from shared.messages import LEASED_CALLS_MAX, BudgetDecision, BudgetRequest, LeasedCall, Usage


@dataclass
class Lease:
    asked: BudgetRequest  # the request the lease was given on
    decision: BudgetDecision  # its answer, the lease with it
    deadline: float  # time.monotonic() after which it no longer holds
    calls: list[LeasedCall] = field(default_factory=list)  # made on it, reported with the next ask
    taking: BudgetRequest | None = None  # the turn taken on it now, whose call is not made yet

    def covers(self, budget: BudgetRequest, now: float) -> bool:
        lease, a, s = self.decision.lease, self.asked, budget.sections
        return (
            lease is not None
            and a.turn < budget.turn <= lease.until_turn
            and now < self.deadline
            and not budget.wrap_up
            and budget.run_id == a.run_id
            and budget.model == a.model
            and budget.tenant == a.tenant
            and budget.context_budget_tokens == a.context_budget_tokens
            and budget.run_token_budget == a.run_token_budget
            and budget.cost_ceiling_usd == a.cost_ceiling_usd
            and (s.goal, s.tools, s.output) == (a.sections.goal, a.sections.tools, a.sections.output)
            and s.history <= lease.max_history_tokens
            and budget.spent.input_tokens + budget.spent.output_tokens <= lease.max_spent_tokens
            and budget.spent.cost_usd <= lease.max_spent_usd
        )


class Leases:
    """The lease this replica holds per run (the most recent ``MAX`` runs)."""

    MAX = 1024

    def __init__(self) -> None:
        self._held: OrderedDict[str, Lease] = OrderedDict()

    def held(self, run_id: str) -> Lease | None:
        return self._held.get(run_id)

    def covers(self, budget: BudgetRequest, now: float | None = None) -> bool:
        """Whether the run's lease allows the turn ``budget`` asks about."""
        lease = self._held.get(budget.run_id)
        return lease is not None and lease.covers(budget, time.monotonic() if now is None else now)

    def allow(self, budget: BudgetRequest, now: float | None = None) -> BudgetDecision | None:
        """The decision for the turn ``budget`` asks about, from the run's lease when it covers it (the turn is
        noted as taken on it: ``called`` records its call); None: the turn asks."""
        lease = self._held.get(budget.run_id)
        if lease is None or not lease.covers(budget, time.monotonic() if now is None else now):
            return None
        lease.taking = budget
        return lease.decision.model_copy(update={"turn": budget.turn, "lease": None})

    def asking(self, budget: BudgetRequest) -> BudgetRequest:
        """``budget`` with the calls made on the run's lease since its ask (the governor learns from them)."""
        lease = self._held.get(budget.run_id)
        if lease is not None and lease.calls:
            budget.leased = [c for c in lease.calls if c.turn < budget.turn][-LEASED_CALLS_MAX:]
        return budget

    def decided(self, asked: BudgetRequest, decision: BudgetDecision, now: float | None = None) -> None:
        """The governor answered ``asked``: its lease, if any, is held from now (the calls reported with the
        ask are its; a lease held before ends here)."""
        if decision.lease is None:
            self._held.pop(asked.run_id, None)
            return
        start = time.monotonic() if now is None else now
        self._held[asked.run_id] = Lease(asked, decision, start + decision.lease.expires_in_s)
        self._held.move_to_end(asked.run_id)
        while len(self._held) > self.MAX:
            self._held.popitem(last=False)

    def called(self, run_id: str, turn: int, usage: Usage) -> None:
        """The model answered the turn ``turn`` taken on the run's lease, with ``usage``."""
        lease = self._held.get(run_id)
        if lease is None or lease.taking is None or lease.taking.turn != turn:
            return
        s = lease.taking.sections
        call = LeasedCall(turn=turn, prompt_tokens=s.goal + s.history + s.tools, usage=usage)
        kept = [c for c in lease.calls if c.turn != turn][-(LEASED_CALLS_MAX - 1) :]
        lease.calls = [*kept, call]
        lease.taking = None

    def drop(self, run_id: str) -> None:
        self._held.pop(run_id, None)
