"""Token and cost budgets (pure arithmetic; the governor's handler only stores and replies).

* Per-section allocations of the context budget: goal 10 %, history 40 %, tools 30 %,
  output 20 %. Slack in the donor sections (goal, output) is lent to the recipients
  (history 60 %, tools 40 %); donors shrink by exactly what they lend, so the total never
  exceeds the budget.
* Calibration: the planner's sections are tiktoken estimates; per model, a running ratio of
  the input tokens the provider reported to the estimate it was asked on scales them here.
* Layered thresholds on the run's tokens — warn, then compact (at ``compact_at`` of the
  history allocation), then block — each fires once (flags in the ledger); compaction
  re-arms when history falls back under its threshold. With a warm prompt cache a soft
  compaction waits longer (``compact_at_cached``): it invalidates the cached prefix, which is
  then re-written at 1.25x the input rate, while keeping it costs 0.1x per turn.
* Cost is estimated at the rates the bill uses (cache reads, cache writes, uncached input).
  A cost ceiling per run; when the next call would eat into the wrap-up reserve, a cheaper
  fallback model is used if that fits, otherwise one last tool-less wrap-up turn if *that*
  fits, otherwise the run stops gracefully (block).
* A daily cost ceiling per tenant (the handler keeps what each tenant spent today).
* A lease (``lease_for``): an ``allow`` with nothing to say may cover the run's next turns, within bounds
  on the history and the run's spend at whose corner the rule above was asked and still allows the same;
  the planner takes those turns without asking and reports their calls when it next asks (``observe``).
"""

from __future__ import annotations

import math
from typing import TypedDict, Unpack

from pydantic import BaseModel, Field

from shared.messages import BudgetDecision, BudgetLease, BudgetRequest, SectionTokens, Usage
from shared.pricing import cost_usd

SHARES = {"goal": 0.10, "history": 0.40, "tools": 0.30, "output": 0.20}
DONORS = ("goal", "output")
RECIPIENTS = {"history": 0.6, "tools": 0.4}
WARM_CACHE_SHARE = 0.5  # the last call read at least this share of its prompt from the cache
CALIBRATION_BOUNDS = (0.5, 3.0)


class BudgetLedger(BaseModel):
    run_id: str
    fired: list[str] = Field(default_factory=list)
    compact_armed: bool = True
    fallback_active: bool = False
    decisions: dict[str, BudgetDecision] = Field(default_factory=dict)
    # --- what the last decided call was asked on, to read the provider's answer to it next turn
    tenant: str | None = None
    last_prompt_estimate: int = Field(0, description="uncalibrated prompt tokens of the last allowed call")
    last_model: str = ""
    last_action: str = ""
    last_spent: Usage = Field(default_factory=Usage)
    last_call: Usage = Field(default_factory=Usage, description="the provider's usage of the last call")
    tenant_accounted_usd: float = Field(0.0, description="this run's spend already added to its tenant's day")
    delegated_usd: float = Field(0.0, description="the part of the run's spend its sub-agents account themselves")
    last_turn: int = Field(0, description="the turn of the last decision")
    leased_to: int = Field(0, description="the last turn that decision's lease covered (0: none)")


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


# --- calibration ------------------------------------------------------------------------------


def observe(ledger: BudgetLedger, req: BudgetRequest) -> list[tuple[str, float]]:
    """Read what the provider reported for the calls since the last decision and remember it; returns
    the (model, reported/estimated) samples that are clean. Without a lease in between, the growth of
    the run's spend is the last call's: a sample when exactly one planner call happened (a compaction
    adds a summary call, so none is taken). After turns taken on a lease, that growth is several calls:
    each call the planner reports (``req.leased``) is one sample of its own."""
    if ledger.leased_to > ledger.last_turn and req.turn > ledger.last_turn + 1:
        return _observe_leased(ledger, req)
    delta = Usage(
        input_tokens=req.spent.input_tokens - ledger.last_spent.input_tokens,
        output_tokens=req.spent.output_tokens - ledger.last_spent.output_tokens,
        cost_usd=round(req.spent.cost_usd - ledger.last_spent.cost_usd, 8),
        cache_read_input_tokens=req.spent.cache_read_input_tokens - ledger.last_spent.cache_read_input_tokens,
        cache_creation_input_tokens=(
            req.spent.cache_creation_input_tokens - ledger.last_spent.cache_creation_input_tokens
        ),
    )
    samples = []
    if ledger.last_prompt_estimate > 0 and delta.input_tokens > 0:
        ledger.last_call = delta
        ratio = delta.input_tokens / ledger.last_prompt_estimate
        # A ratio far outside what two tokenizers differ by measures something else (a scripted or
        # overridden usage, a provider-side addition): it is not taken.
        if ledger.last_action in ("allow", "warn") and _plausible(ratio):
            samples.append((ledger.last_model, ratio))
    ledger.last_spent = req.spent
    return samples


def _plausible(ratio: float) -> bool:
    lo, hi = CALIBRATION_BOUNDS
    return lo <= ratio <= hi


def _observe_leased(ledger: BudgetLedger, req: BudgetRequest) -> list[tuple[str, float]]:
    """The calls made on the last decision's lease (an ``allow`` of ``ledger.last_model``), as the planner
    reports them: none reported (another replica took the turns, or the planner restarted) is no sample."""
    samples = []
    for call in req.leased:
        if ledger.last_turn < call.turn < req.turn and call.prompt_tokens > 0 and call.usage.input_tokens > 0:
            ledger.last_call = call.usage
            ratio = call.usage.input_tokens / call.prompt_tokens
            if _plausible(ratio):
                samples.append((ledger.last_model, ratio))
    ledger.last_spent = req.spent
    return samples


def updated_ratio(old: float | None, sample: float, weight: float) -> float:
    """The running (exponentially weighted) ratio after one more sample."""
    return round(sample if old is None else old + weight * (sample - old), 4)


def calibrated(sections: SectionTokens, ratio: float) -> SectionTokens:
    """The prompt sections as the provider will count them (the output room is a cap, not an estimate)."""
    return SectionTokens(
        goal=round(sections.goal * ratio),
        history=round(sections.history * ratio),
        tools=round(sections.tools * ratio),
        output=sections.output,
    )


# --- cost at the bill's rates ----------------------------------------------------------------


def cache_warm(ledger: BudgetLedger) -> bool:
    last = ledger.last_call
    return last.input_tokens > 0 and last.cache_read_input_tokens >= WARM_CACHE_SHARE * last.input_tokens


def caching(ledger: BudgetLedger) -> bool:
    last = ledger.last_call
    return last.cache_read_input_tokens + last.cache_creation_input_tokens > 0


def estimate_cost(model: str, prompt: int, output: int, ledger: BudgetLedger) -> float:
    """The next call's cost: with the prompt cache in use, what the last call's prompt held is read
    at the cache rate and the rest written; otherwise every prompt token at the input rate."""
    if not caching(ledger):
        return cost_usd(model, prompt, output)
    read = min(prompt, ledger.last_call.input_tokens) if model == ledger.last_model else 0
    return cost_usd(model, prompt, output, cache_read=read, cache_write=prompt - read)


# --- the decision ----------------------------------------------------------------------------


def evaluate(
    req: BudgetRequest,
    ledger: BudgetLedger,
    *,
    warn_at: float,
    compact_at: float,
    fallback_model: str | None,
    exhausted_policy: str,
    compact_at_cached: float = 0.95,
    wrap_up_reserve_usd: float = 0.0,
    wrap_up_output_tokens: int = 1024,
    calibration: float = 1.0,
    tenant_spent_usd: float | None = None,
    tenant_ceiling_usd: float | None = None,
) -> BudgetDecision:
    """The decision for one model call. Mutates ``ledger`` flags; the caller stores both."""
    sections = calibrated(req.sections, calibration)
    alloc = rebalance(allocate(req.context_budget_tokens), sections)
    reasons: list[str] = []
    fired: list[str] = []

    def fire(flag: str) -> None:
        if flag not in ledger.fired:
            ledger.fired.append(flag)
            fired.append(flag)

    model = fallback_model if ledger.fallback_active and fallback_model else req.model
    # The reply is capped at the output allocation, so that is what it can cost.
    output = min(sections.output, alloc["output"]) if alloc["output"] else sections.output
    prompt = sections.goal + sections.history + sections.tools
    context_total = prompt + output
    spent_tokens = req.spent.input_tokens + req.spent.output_tokens
    ratio = (spent_tokens + context_total) / req.run_token_budget
    history_ratio = sections.history / alloc["history"] if alloc["history"] else 1.0
    warm = cache_warm(ledger)

    action = "allow"
    estimate = estimate_cost(model, prompt, output, ledger)
    wrap_output = min(output, wrap_up_output_tokens)
    wrap_model, wrap_cost = model, estimate_cost(model, prompt, wrap_output, ledger)
    if fallback_model and fallback_model != model:  # the wrap-up may be answered by the cheaper model
        cheaper_wrap = estimate_cost(fallback_model, prompt, wrap_output, ledger)
        if cheaper_wrap < wrap_cost:
            wrap_model, wrap_cost = fallback_model, cheaper_wrap
    room = req.cost_ceiling_usd - req.spent.cost_usd
    tenant_room = None if tenant_ceiling_usd is None else tenant_ceiling_usd - (tenant_spent_usd or 0.0)
    if tenant_room is not None and estimate > tenant_room:
        action = "block"
        reasons.append(
            f"tenant {req.tenant} daily cost ceiling ${tenant_ceiling_usd:.2f} reached "
            f"(spent ${tenant_spent_usd or 0.0:.4f} today; this call ~${estimate:.4f})"
        )
    elif room <= 0:
        action = "block"
        reasons.append(f"cost ceiling ${req.cost_ceiling_usd:.2f} reached (spent ${req.spent.cost_usd:.4f})")
    elif req.wrap_up:
        if wrap_cost > room:
            action = "block"
            reasons.append(f"no room left for a wrap-up turn (~${wrap_cost:.4f}; ${room:.4f} left)")
        else:
            action, model, output, estimate = "wrap_up", wrap_model, wrap_output, wrap_cost
            reasons.append("wrap-up turn: one last answer without tools")
    elif estimate > room - wrap_up_reserve_usd:
        cheaper = estimate_cost(fallback_model, prompt, output, ledger) if fallback_model else estimate
        if (
            exhausted_policy == "fallback_model"
            and fallback_model
            and model != fallback_model
            and cheaper < estimate
            and cheaper <= room - wrap_up_reserve_usd
        ):
            model = fallback_model
            estimate = cheaper
            ledger.fallback_active = True
            fire("fallback")
            reasons.append(f"next call would cross the cost ceiling; switching to {fallback_model}")
        elif wrap_cost <= room and "wrap_up" not in ledger.fired:
            reasons.append(
                f"cost ceiling ${req.cost_ceiling_usd:.2f} is near (spent ${req.spent.cost_usd:.4f}, a normal turn "
                f"~${estimate:.4f}): one last turn without tools (~${wrap_cost:.4f}) for the best final answer"
            )
            action, model, output, estimate = "wrap_up", wrap_model, wrap_output, wrap_cost
            fire("wrap_up")
        else:
            action = "block"
            reasons.append(f"next call (~${estimate:.4f}) would cross the cost ceiling ${req.cost_ceiling_usd:.2f}")
    if action not in ("block", "wrap_up") and ratio >= 1.0:
        action = "block"
        reasons.append(
            f"run token budget {req.run_token_budget} exhausted ({spent_tokens + context_total} with this call)"
        )
    if action not in ("block", "wrap_up") and context_total > req.context_budget_tokens:
        if sections.history > 0 and ledger.compact_armed:
            action = "compact"
            reasons.append(f"context {context_total} tokens exceeds its budget {req.context_budget_tokens}")
        else:
            action = "block"
            reasons.append(
                f"context {context_total} tokens exceeds its budget {req.context_budget_tokens} "
                "and compaction cannot help"
            )
    soft_at = max(compact_at, compact_at_cached) if warm else compact_at
    if action == "allow" and history_ratio >= soft_at and ledger.compact_armed:
        action = "compact"
        reasons.append(f"history at {history_ratio:.0%} of its allocation ({sections.history}/{alloc['history']})")
    elif action == "allow" and history_ratio >= compact_at and ledger.compact_armed:
        reasons.append(
            f"history at {history_ratio:.0%} of its allocation, but the prompt cache is warm: compacting now "
            f"would re-write the cached prefix; waiting until {soft_at:.0%}"
        )
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
    ledger.last_prompt_estimate = req.sections.goal + req.sections.history + req.sections.tools
    ledger.last_model = model
    ledger.last_action = action
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
        calibration=calibration,
        estimated_cost_usd=round(estimate, 8),
    )


# --- the lease -------------------------------------------------------------------------------


class Rule(TypedDict):
    """``evaluate``'s settings for one decision (its tenant ceiling aside)."""

    warn_at: float
    compact_at: float
    fallback_model: str | None
    exhausted_policy: str
    compact_at_cached: float
    wrap_up_reserve_usd: float
    wrap_up_output_tokens: int
    calibration: float


def lease_for(
    req: BudgetRequest,
    ledger: BudgetLedger,
    decision: BudgetDecision,
    *,
    turns: int,
    seconds: float,
    **rule: Unpack[Rule],
) -> BudgetLease | None:
    """The later turns ``decision`` may cover (``rule``: ``evaluate``'s keyword arguments, its
    ``calibration`` included, no tenant ceiling): none unless it allows with nothing to say. The
    bounds: the history may grow half the way to where the rule compacts or the context overflows;
    the run's spent tokens and cost up to where, with that history, the rule would warn, block, fall
    back or wrap up, at the dearest cache rates. Every condition of the rule only tightens as the
    history and the spend grow (the other sections, the model and the ledger's flags held as they
    are), so where it allows the same at the corner of the bounds it does everywhere inside them:
    that is checked, by asking the rule itself at the corner, before the lease is given."""
    if turns <= 0 or req.wrap_up or decision.action != "allow" or decision.reasons or decision.fired:
        return None
    c = decision.calibration
    alloc = decision.allocations
    s = req.sections
    out = min(s.output, alloc["output"]) if alloc.get("output") else s.output  # as ``evaluate`` caps the reply

    def at(history: int) -> SectionTokens:
        return calibrated(SectionTokens(goal=s.goal, history=history, tools=s.tools, output=s.output), c)

    def fits(history: int) -> bool:
        cs = at(history)
        room = alloc.get("history", 0)
        return (
            room > 0
            and cs.history / room < rule["compact_at"]
            and cs.goal + cs.history + cs.tools + out <= req.context_budget_tokens
        )

    head = at(0)
    top = min(rule["compact_at"] * alloc.get("history", 0), req.context_budget_tokens - head.goal - head.tools - out)
    limit = int(max(0.0, top) / c) + 2
    while limit >= s.history and not fits(limit):
        limit -= 1
    if limit < s.history:
        return None
    history = s.history + (limit - s.history) // 2
    cs = at(history)
    prompt = cs.goal + cs.history + cs.tools
    share = 1.0 if "warn" in ledger.fired else rule["warn_at"]
    tokens = math.ceil(share * req.run_token_budget - prompt - out) - 1
    while tokens >= 0 and (tokens + prompt + out) / req.run_token_budget >= share:
        tokens -= 1
    dearest = max(cost_usd(decision.model, prompt, out), cost_usd(decision.model, prompt, out, cache_write=prompt))
    usd = round(req.cost_ceiling_usd - rule["wrap_up_reserve_usd"] - dearest, 8) - 1e-8
    spent = req.spent
    if tokens < spent.input_tokens + spent.output_tokens or usd < spent.cost_usd:
        return None
    corner = req.model_copy(
        update={
            "turn": req.turn + turns,
            "sections": SectionTokens(goal=s.goal, history=history, tools=s.tools, output=s.output),
            "spent": Usage(input_tokens=tokens, cost_usd=usd),
        }
    )
    uncached, written = Usage(), Usage(input_tokens=1, cache_creation_input_tokens=1)  # the dearest: all written
    for last_call, last_model in ((uncached, ledger.last_model), (written, "")):
        asked = ledger.model_copy(deep=True, update={"last_call": last_call, "last_model": last_model})
        d = evaluate(corner, asked, **rule)
        if (d.action, d.model, d.max_output_tokens, d.reasons, d.fired) != (
            "allow",
            decision.model,
            decision.max_output_tokens,
            [],
            [],
        ):
            return None
    return BudgetLease(
        until_turn=req.turn + turns,
        expires_in_s=seconds,
        max_history_tokens=history,
        max_spent_tokens=tokens,
        max_spent_usd=usd,
    )
