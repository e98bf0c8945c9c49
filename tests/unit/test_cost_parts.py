"""Pure parts of cost accounting: the prompt cache's arithmetic, prices at cache rates, the governor's
calibration, cache-aware compaction, wrap-up and tenant decisions, history counted once per message."""

from __future__ import annotations

import functools
import gc
import sys
import time
from collections.abc import Callable

import pytest
from pydantic import ValidationError

from services.governor.budget import BudgetLedger, calibrated, evaluate, observe, updated_ratio
from services.planner import context as C
from shared import tokens
from shared.messages import BudgetRequest, ChatMessage, SectionTokens, Usage
from shared.pricing import cost_usd, model_price, usage_for
from shared.providers.prompt_cache import Block, PromptCache
from shared.settings import Settings
from tests.support.transitions import state_of


def blocks(*sizes: int, marks: tuple[int, ...] = ()) -> list[Block]:
    return [Block(key=f"b{i}-{n}", tokens=n, breakpoint=i in marks) for i, n in enumerate(sizes)]


# --- the prompt cache --------------------------------------------------------------------------


def test_a_prefix_is_written_once_then_read_and_the_new_tail_written() -> None:
    cache = PromptCache()
    first = cache.answer("claude-sonnet-4-5", blocks(800, 400, 300, marks=(1, 2)))
    assert (first.read, first.written, first.total) == (0, 1500, 1500)
    second = cache.answer("claude-sonnet-4-5", blocks(800, 400, 300, 200, 100, marks=(1, 4)))
    assert (second.read, second.written) == (1500, 300)  # found by looking back from the rolling breakpoint


def test_below_the_minimum_nothing_is_cached_and_other_models_do_not_share() -> None:
    cache = PromptCache()
    assert cache.answer("claude-sonnet-4-5", blocks(500, 400, marks=(1,))).written == 0  # 900 < 1024
    cache.answer("claude-sonnet-4-5", blocks(900, 400, marks=(1,)))
    assert cache.answer("claude-opus-4-1", blocks(900, 400, marks=(1,))).read == 0


def test_a_changed_prefix_misses_and_entries_expire() -> None:
    cache = PromptCache(ttl_s=0.05)
    cache.answer("claude-sonnet-4-5", blocks(900, 400, marks=(1,)))
    changed = [Block("other", 900), Block("b1-400", 400, True)]
    assert cache.answer("claude-sonnet-4-5", changed).read == 0
    time.sleep(0.06)
    assert cache.answer("claude-sonnet-4-5", blocks(900, 400, marks=(1,))).read == 0


def test_no_breakpoint_no_cache() -> None:
    answer = PromptCache().answer("claude-sonnet-4-5", blocks(5000, 5000))
    assert (answer.read, answer.written, answer.total) == (0, 0, 10_000)


# --- prices -------------------------------------------------------------------------------------


def test_cache_rates() -> None:
    p = model_price("claude-sonnet-4-5-20250929")
    assert (p.input, p.cache_write, p.cache_read, p.output) == (3.0, 3.75, 0.3, 15.0)
    # 10k prompt tokens: 8k read, 1k written, 1k uncached; 100 output
    assert cost_usd("claude-sonnet-4-5", 10_000, 100, cache_read=8000, cache_write=1000) == pytest.approx(
        (1000 * 3 + 1000 * 3.75 + 8000 * 0.3 + 100 * 15) / 1e6
    )
    u = usage_for("claude-sonnet-4-5", 10_000, 100, cache_read=8000, cache_write=1000) + Usage(input_tokens=5)
    assert (u.input_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens) == (10_005, 8000, 1000)


# --- governor ----------------------------------------------------------------------------------


def req(turn: int = 1, *, history: int = 1000, spent: Usage | None = None, **kw: object) -> BudgetRequest:
    return BudgetRequest(
        run_id="r",
        turn=turn,
        model="claude-sonnet-4-5",
        sections=SectionTokens(goal=500, history=history, tools=800, output=1000),
        spent=spent or Usage(),
        context_budget_tokens=20_000,
        run_token_budget=1_000_000,
        cost_ceiling_usd=float(kw.get("ceiling", 1.0)),  # type: ignore[arg-type]
        tenant=kw.get("tenant"),  # type: ignore[arg-type]
        wrap_up=bool(kw.get("wrap_up", False)),
    )


def decide(r: BudgetRequest, ledger: BudgetLedger, **kw: object):  # type: ignore[no-untyped-def]
    return evaluate(
        r,
        ledger,
        warn_at=0.7,
        compact_at=0.8,
        fallback_model="claude-haiku-4-5",
        exhausted_policy="fallback_model",
        **kw,  # type: ignore[arg-type]
    )


def test_calibration_samples_the_reported_tokens_of_the_last_call() -> None:
    ledger = BudgetLedger(run_id="r")
    decide(req(1), ledger)
    assert ledger.last_prompt_estimate == 2300
    sample = observe(ledger, req(2, spent=Usage(input_tokens=2760, output_tokens=50)))
    assert sample == [("claude-sonnet-4-5", pytest.approx(1.2))]
    # a scripted 100-token usage is no tokenizer difference: not taken
    decide(req(2), ledger)
    assert observe(ledger, req(3, spent=Usage(input_tokens=2860, output_tokens=60))) == []
    assert updated_ratio(None, 1.2, 0.2) == 1.2 and updated_ratio(1.0, 2.0, 0.2) == 1.2
    assert calibrated(SectionTokens(goal=100, history=1000, tools=10, output=500), 1.5) == SectionTokens(
        goal=150, history=1500, tools=15, output=500
    )


def test_calibration_is_applied_to_the_decision() -> None:
    plain = decide(req(1, history=6000), BudgetLedger(run_id="r"))
    scaled = decide(req(1, history=6000), BudgetLedger(run_id="r"), calibration=1.5)
    assert plain.action == "allow" and scaled.action == "compact"  # 9000 tokens of history cross 80 %
    assert scaled.calibration == 1.5 and scaled.estimated_cost_usd > plain.estimated_cost_usd


def warm_ledger() -> BudgetLedger:
    ledger = BudgetLedger(run_id="r", last_model="claude-sonnet-4-5")
    ledger.last_call = Usage(input_tokens=8000, cache_read_input_tokens=7000, cache_creation_input_tokens=900)
    return ledger


def test_a_warm_cache_defers_soft_compaction_but_not_a_full_context() -> None:
    # history at ~85 % of its allocation: compacted when cold, kept while the cache is warm
    assert decide(req(1, history=9100), BudgetLedger(run_id="r")).action == "compact"
    kept = decide(req(1, history=9100), warm_ledger())
    assert kept.action == "allow" and any("prompt cache is warm" in r for r in kept.reasons)
    assert decide(req(1, history=10300), warm_ledger()).action == "compact"  # past 95 %
    assert decide(req(1, history=18_000), warm_ledger()).action == "compact"  # over the context budget


def test_cost_is_estimated_at_cache_rates_when_caching() -> None:
    cold = decide(req(1, history=5000), BudgetLedger(run_id="r"))
    warm = decide(req(1, history=5000), warm_ledger())
    assert warm.estimated_cost_usd < cold.estimated_cost_usd


def test_near_the_ceiling_a_wrap_up_then_a_block() -> None:
    ledger = BudgetLedger(run_id="r", fallback_active=True)  # already on the cheaper model
    spent = Usage(input_tokens=10_000, cost_usd=0.995)
    d = decide(req(5, spent=spent), ledger, wrap_up_output_tokens=200)
    assert d.action == "wrap_up" and d.max_output_tokens == 200 and "wrap_up" in d.fired
    # the wrap-up turn itself is allowed once if it fits, then the run is blocked
    again = decide(req(6, spent=spent, wrap_up=True), ledger, wrap_up_output_tokens=200)
    assert again.action == "wrap_up"
    over = decide(req(7, spent=Usage(cost_usd=1.0)), ledger)
    assert over.action == "block"


def test_a_tenant_over_its_ceiling_is_blocked() -> None:
    d = decide(req(1, tenant="acme"), BudgetLedger(run_id="r"), tenant_spent_usd=4.99, tenant_ceiling_usd=5.0)
    assert d.action == "block" and "tenant acme daily cost ceiling $5.00" in d.reasons[0]
    ok = decide(req(1, tenant="acme"), BudgetLedger(run_id="r"), tenant_spent_usd=1.0, tenant_ceiling_usd=5.0)
    assert ok.action == "allow"


def test_tenant_ceilings_setting_is_checked() -> None:
    assert Settings(tenant_ceilings={"acme": 2.5}).tenant_ceilings == {"acme": 2.5}
    with pytest.raises(ValidationError, match="acme: a daily ceiling must be above 0"):
        Settings(tenant_ceilings={"acme": 0})


# --- history counted once per message ---------------------------------------------------------


def test_history_tokens_counts_new_messages_only_and_agrees_with_a_full_count() -> None:
    s = state_of(40)
    full = sum(tokens.count_message(m) for m in s.messages)
    assert C.history_tokens(s.run_id, s.messages[:30]) == sum(tokens.count_message(m) for m in s.messages[:30])
    assert C.history_tokens(s.run_id, s.messages) == full
    # a compaction replaces the head: counted again, whole
    s.messages = [ChatMessage.user("summary"), *s.messages[-4:]]
    assert C.history_tokens(s.run_id, s.messages) == sum(tokens.count_message(m) for m in s.messages)


def test_one_line_summaries() -> None:
    assert C.one_line("Search the corpus. Returns documents.") == "Search the corpus."
    assert len(C.one_line("x" * 500)) == 90


def calls_made(fn: Callable[[], object]) -> int:
    """Python and C function calls ``fn`` makes: a count of its work that a loaded machine does not change."""
    made = 0

    def profile(frame: object, event: str, arg: object) -> None:
        nonlocal made
        if event in ("call", "c_call"):
            made += 1

    gc.disable()  # a collection would count the finalizers it runs
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
        gc.enable()
    return made


def count_all(messages: list[ChatMessage]) -> int:
    return sum(tokens.count_message(m) for m in messages)


def test_a_budget_check_costs_the_same_at_step_80_as_at_step_10() -> None:
    """The short form of ``make bench --only cost``'s check timing, counted in calls rather than timed."""
    from bench.cost import SNIPPET, budget_check_at
    from shared.messages import ToolResultBlock, ToolUseBlock

    s = state_of(1)
    for i in range(80):
        s.messages.append(
            ChatMessage(role="assistant", content=[ToolUseBlock(id=f"t{i}", name="search", input={"query": f"q{i}"})])
        )
        s.messages.append(
            ChatMessage(role="user", content=[ToolResultBlock(tool_use_id=f"t{i}", content=SNIPPET + str(i))])
        )
    made = {}
    for step in (10, 80):
        warm, check = budget_check_at(s, step, {})
        warm()
        made[step] = calls_made(check)
    # the same work, give or take a threshold the larger history makes fire in the decision
    assert made[80] < 1.25 * made[10], made
    # what counting every message again costs: the count the check avoids grows with the history
    recount = {step: calls_made(functools.partial(count_all, s.messages[: 1 + 2 * step])) for step in (10, 80)}
    assert recount[80] > 7 * recount[10], recount
