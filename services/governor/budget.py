"""Token and cost budgets (pure arithmetic; the governor's handler only stores and replies).

* Per-section allocations of the context budget: goal 10 %, history 40 %, tools 30 %,
  output 20 %. Slack in the donor sections (goal, output) is lent to the recipients
  (history 60 %, tools 40 %); donors shrink by exactly what they lend, so the total never
  exceeds the budget.
* Layered thresholds on the run's tokens — warn, then compact (at ``compact_at`` of the
  history allocation), then block — each fires once (flags in the ledger); compaction
  re-arms when history falls back under its threshold.
* A cost ceiling per run; when the next call would cross it, a cheaper fallback model is
  used if that fits, otherwise the run stops gracefully (block).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from shared.messages import BudgetDecision, BudgetRequest, SectionTokens
from shared.pricing import cost_usd

SHARES = {"goal": 0.10, "history": 0.40, "tools": 0.30, "output": 0.20}
DONORS = ("goal", "output")
RECIPIENTS = {"history": 0.6, "tools": 0.4}


class BudgetLedger(BaseModel):
    run_id: str
    fired: list[str] = Field(default_factory=list)
    compact_armed: bool = True
    fallback_active: bool = False
    decisions: dict[str, BudgetDecision] = Field(default_factory=dict)


def allocate(total: int) -> dict[str, int]:
    alloc = {k: int(total * share) for k, share in SHARES.items()}
    alloc["history"] += total - sum(alloc.values())  # rounding remainder
    return alloc


def rebalance(alloc: dict[str, int], used: SectionTokens) -> dict[str, int]:
    """Lend the donors' unused allocation to history and tools; the total is unchanged."""
    usage = used.model_dump()
    out = dict(alloc)
    slack = 0
    for k in DONORS:
        free = max(0, out[k] - usage[k])
        out[k] -= free
        slack += free
    to_history = int(slack * RECIPIENTS["history"])
    out["history"] += to_history
    out["tools"] += slack - to_history
    assert sum(out.values()) == sum(alloc.values())
    return out


def evaluate(
    req: BudgetRequest,
    ledger: BudgetLedger,
    *,
    warn_at: float,
    compact_at: float,
    fallback_model: str | None,
    exhausted_policy: str,
) -> BudgetDecision:
    """The decision for one model call. Mutates ``ledger`` flags; the caller stores both."""
    alloc = rebalance(allocate(req.context_budget_tokens), req.sections)
    reasons: list[str] = []
    fired: list[str] = []

    def fire(flag: str) -> None:
        if flag not in ledger.fired:
            ledger.fired.append(flag)
            fired.append(flag)

    model = fallback_model if ledger.fallback_active and fallback_model else req.model
    # The reply is capped at the output allocation, so that is what it can cost.
    output = min(req.sections.output, alloc["output"]) if alloc["output"] else req.sections.output
    prompt = req.sections.goal + req.sections.history + req.sections.tools
    context_total = prompt + output
    spent_tokens = req.spent.input_tokens + req.spent.output_tokens
    ratio = (spent_tokens + context_total) / req.run_token_budget
    history_ratio = req.sections.history / alloc["history"] if alloc["history"] else 1.0

    action = "allow"
    estimate = cost_usd(model, prompt, output)
    if req.spent.cost_usd >= req.cost_ceiling_usd:
        action = "block"
        reasons.append(f"cost ceiling ${req.cost_ceiling_usd:.2f} reached (spent ${req.spent.cost_usd:.4f})")
    elif req.spent.cost_usd + estimate > req.cost_ceiling_usd:
        cheaper = cost_usd(fallback_model, prompt, output) if fallback_model else estimate
        if (
            exhausted_policy == "fallback_model"
            and fallback_model
            and cheaper < estimate
            and req.spent.cost_usd + cheaper <= req.cost_ceiling_usd
        ):
            model = fallback_model
            ledger.fallback_active = True
            fire("fallback")
            reasons.append(f"next call would cross the cost ceiling; switching to {fallback_model}")
        else:
            action = "block"
            reasons.append(f"next call (~${estimate:.4f}) would cross the cost ceiling ${req.cost_ceiling_usd:.2f}")
    if action != "block" and ratio >= 1.0:
        action = "block"
        reasons.append(
            f"run token budget {req.run_token_budget} exhausted ({spent_tokens + context_total} with this call)"
        )
    if action != "block" and context_total > req.context_budget_tokens:
        if req.sections.history > 0 and ledger.compact_armed:
            action = "compact"
            reasons.append(f"context {context_total} tokens exceeds its budget {req.context_budget_tokens}")
        else:
            action = "block"
            reasons.append(
                f"context {context_total} tokens exceeds its budget {req.context_budget_tokens} "
                "and compaction cannot help"
            )
    if action == "allow" and history_ratio >= compact_at and ledger.compact_armed:
        action = "compact"
        reasons.append(f"history at {history_ratio:.0%} of its allocation ({req.sections.history}/{alloc['history']})")
    if action == "compact":
        ledger.compact_armed = False
        fire("compact")
    elif history_ratio < compact_at:
        ledger.compact_armed = True
        if "compact" in ledger.fired:
            ledger.fired.remove("compact")  # re-armed: the next crossing fires again
    if ratio >= warn_at and "warn" not in ledger.fired:
        # Layered: the warning fires once when its threshold is crossed, even on a turn whose
        # action is a compaction or a block (a jump past every threshold still warns first).
        reasons.append(f"run has used {ratio:.0%} of its token budget")
        if action == "allow":
            action = "warn"
        fire("warn")
    if action == "block":
        fire("block")
    remaining = max(0, req.run_token_budget - spent_tokens - prompt)
    return BudgetDecision(
        run_id=req.run_id,
        turn=req.turn,
        action=action,
        model=model,
        max_output_tokens=max(16, min(output, remaining)),
        reasons=reasons,
        fired=fired,
        allocations=alloc,
        usage_ratio=round(ratio, 4),
    )
