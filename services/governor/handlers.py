"""Governor handler: one budget decision per (run, turn), stored, so a retried request gets
the same answer and thresholds fire once."""

from __future__ import annotations

from collections import OrderedDict

from services.governor.budget import BudgetLedger, evaluate
from shared import subjects as S
from shared import telemetry as T
from shared.bus import Bus, Unchanged
from shared.messages import BudgetDecision, BudgetRequest, BudgetThreshold, BudgetThresholdKind, ErrorReply
from shared.settings import Settings

THRESHOLD_KINDS: dict[str, BudgetThresholdKind] = {
    "warn": "budget.warn",
    "compact": "budget.compact",
    "block": "budget.block",
}  # any other threshold that fires is a model fallback
KEEP_DECISIONS = 8  # recent turns whose decision a redelivered request gets again


class Governor:
    def __init__(self, bus: Bus, settings: Settings, telemetry: T.Telemetry) -> None:
        self.bus, self.settings = bus, settings
        self.tracer = telemetry.tracer("loopwarden.governor")
        self.decisions = telemetry.meter("loopwarden.governor").create_counter(
            "loopwarden.budget.decisions", description="budget decisions by action"
        )

        # The ledger this replica last stored per run, with its revision: tried first under CAS
        # (a conflict re-reads), so a turn costs one KV write and no read.
        self._ledgers: OrderedDict[str, tuple[BudgetLedger, int]] = OrderedDict()

    def keep(self, key: str, ledger: BudgetLedger | None, revision: int) -> None:
        if ledger is None:
            return
        self._ledgers[key] = (ledger, revision)
        self._ledgers.move_to_end(key)
        while len(self._ledgers) > 1024:
            self._ledgers.popitem(last=False)

    def register(self) -> None:
        self.bus.responder(
            subject=S.BUDGET_RESERVE,
            model=BudgetRequest,
            reply=lambda reason: ErrorReply(error=reason),  # typed: the planner parses it
        )(self.on_reserve)

    async def on_reserve(self, req: BudgetRequest) -> BudgetDecision:
        s = self.settings

        def decide(ledger: BudgetLedger | None) -> tuple[BudgetLedger, BudgetDecision] | Unchanged[BudgetDecision]:
            ledger = ledger or BudgetLedger(run_id=req.run_id)
            if str(req.turn) in ledger.decisions:  # asked again (a redelivery): the same answer
                return Unchanged(ledger.decisions[str(req.turn)])
            decision = evaluate(
                req,
                ledger,
                warn_at=s.warn_at,
                compact_at=s.compact_at,
                fallback_model=s.fallback_model,
                exhausted_policy=s.budget_exhausted_policy,
            )
            ledger.decisions[str(req.turn)] = decision
            for old in sorted(ledger.decisions, key=int)[:-KEEP_DECISIONS]:  # the ledger does not grow with the run
                del ledger.decisions[old]
            return ledger, decision

        with self.tracer.start_as_current_span(
            "budget reserve", attributes={T.LW_RUN_ID: req.run_id, T.GEN_AI_REQUEST_MODEL: req.model}
        ) as span:
            key = S.kv_key(req.run_id)
            decision = await self.bus.update(
                S.KV_BUDGETS,
                key,
                BudgetLedger,
                decide,
                known=self._ledgers.pop(key, None),
                saved=lambda v, rev: self.keep(key, v, rev),
            )
            span.set_attribute(T.LW_BUDGET_ACTION, decision.action)
        self.decisions.add(1, {"action": decision.action})
        for flag in decision.fired:
            kind = THRESHOLD_KINDS.get(flag, "budget.fallback")
            level = kind.removeprefix("budget.")
            await self.bus.publish(
                S.budget_event(level),
                BudgetThreshold(
                    run_id=req.run_id,
                    kind=kind,
                    iteration=req.turn,
                    summary="; ".join(decision.reasons),
                    detail=decision,
                ),
                msg_id=f"{req.run_id}.budget.{req.turn}.{flag}",
            )
        return decision
