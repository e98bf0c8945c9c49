"""Budget arithmetic: allocations, rebalancing that never exceeds the total, once-firing thresholds."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.governor.budget import BudgetLedger, allocate, evaluate, rebalance
from shared.messages import BudgetRequest, SectionTokens, Usage


def req(turn: int = 1, history: int = 1000, spent: int = 0, cost: float = 0.0, **kw) -> BudgetRequest:  # type: ignore[no-untyped-def]
    return BudgetRequest(
        run_id="r",
        turn=turn,
        model="claude-sonnet-4-5",
        sections=SectionTokens(goal=500, history=history, tools=800, output=1000),
        spent=Usage(input_tokens=spent, output_tokens=0, cost_usd=cost),
        context_budget_tokens=kw.get("context", 20_000),
        run_token_budget=kw.get("run", 100_000),
        cost_ceiling_usd=kw.get("ceiling", 1.0),
    )


def ev(r: BudgetRequest, ledger: BudgetLedger, fallback: str | None = "claude-haiku-4-5"):  # type: ignore[no-untyped-def]
    return evaluate(r, ledger, warn_at=0.7, compact_at=0.8, fallback_model=fallback, exhausted_policy="fallback_model")


def test_default_shares() -> None:
    assert allocate(10_000) == {"goal": 1000, "history": 4000, "tools": 3000, "output": 2000}


@given(
    total=st.integers(1000, 10**6),
    goal=st.integers(0, 10**6),
    history=st.integers(0, 10**6),
    tools=st.integers(0, 10**6),
    output=st.integers(0, 10**6),
)
def test_rebalance_moves_only_donor_slack_and_keeps_the_total(
    total: int, goal: int, history: int, tools: int, output: int
) -> None:
    base = allocate(total)
    after = rebalance(base, SectionTokens(goal=goal, history=history, tools=tools, output=output))
    assert sum(after.values()) == total
    assert after["goal"] <= base["goal"] and after["output"] <= base["output"]
    assert after["history"] >= base["history"] and after["tools"] >= base["tools"]


def test_thresholds_fire_once_in_order() -> None:
    ledger = BudgetLedger(run_id="r")
    assert ev(req(turn=1, spent=10_000), ledger).action == "allow"
    d = ev(req(turn=2, spent=70_000), ledger)
    assert d.action == "warn" and d.fired == ["warn"]
    d = ev(req(turn=3, spent=71_000), ledger)
    assert d.action == "allow" and d.fired == []  # warned already
    d = ev(req(turn=4, spent=99_000), ledger)
    assert d.action == "block" and d.fired == ["block"]


def test_compaction_fires_at_80_percent_of_history_and_rearms() -> None:
    ledger = BudgetLedger(run_id="r")
    alloc = rebalance(allocate(20_000), SectionTokens(goal=500, history=9000, tools=800, output=1000))
    high = int(alloc["history"] * 0.85)
    d = ev(req(turn=1, history=high), ledger)
    assert d.action == "compact" and "compact" in d.fired
    assert ev(req(turn=2, history=high), ledger).action == "allow"  # fired once: no compaction storm
    ev(req(turn=3, history=100), ledger)  # compacted: below the threshold again, re-armed
    assert ev(req(turn=4, history=high), ledger).action == "compact"


def test_cost_ceiling_switches_to_a_cheaper_model_then_blocks() -> None:
    ledger = BudgetLedger(run_id="r")
    d = ev(req(cost=0.985, ceiling=1.0), ledger)  # sonnet ~$0.022 would cross it, haiku ~$0.007 fits
    assert d.action == "allow" and d.model == "claude-haiku-4-5" and "fallback" in d.fired
    assert ev(req(turn=2, cost=1.0, ceiling=1.0), ledger).action == "block"
    assert ev(req(turn=1, cost=0.999, ceiling=1.0), BudgetLedger(run_id="x"), fallback=None).action == "block"


def test_context_over_budget_compacts_then_blocks() -> None:
    ledger = BudgetLedger(run_id="r")
    assert ev(req(history=30_000), ledger).action == "compact"
    assert ev(req(turn=2, history=30_000), ledger).action == "block"
