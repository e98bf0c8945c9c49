"""A budget decision's lease (issue 36): the governor's bounds (``lease_for``) are where its own rule still
allows the same, checked everywhere inside them; the planner takes a turn on a lease only inside them
(``services/planner/leases.py``); the calls made on a lease are the governor's calibration samples."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.governor.budget import BudgetLedger, Rule, evaluate, lease_for, observe
from services.planner.leases import Leases
from shared.messages import BudgetDecision, BudgetRequest, LeasedCall, SectionTokens, Usage

MODEL = "claude-sonnet-4-5"


def rule(**kw: object) -> Rule:
    r = Rule(
        warn_at=0.7,
        compact_at=0.8,
        fallback_model="claude-haiku-4-5",
        exhausted_policy="fallback_model",
        compact_at_cached=0.95,
        wrap_up_reserve_usd=0.0,
        wrap_up_output_tokens=1024,
        calibration=1.0,
    )
    r.update(kw)  # type: ignore[typeddict-item]
    return r


def req(
    turn: int = 1, *, history: int = 1000, tokens: int = 0, usd: float = 0.0, ceiling: float = 1.0, **kw: object
) -> BudgetRequest:
    return BudgetRequest(
        run_id="r",
        turn=turn,
        model=MODEL,
        sections=SectionTokens(goal=500, history=history, tools=800, output=1000),
        spent=Usage(input_tokens=tokens, cost_usd=usd),
        context_budget_tokens=20_000,
        run_token_budget=200_000,
        cost_ceiling_usd=ceiling,
        wrap_up=bool(kw.get("wrap_up", False)),
        leased=kw.get("leased", []),  # type: ignore[arg-type]
    )


def granted(r: BudgetRequest, ledger: BudgetLedger | None = None, turns: int = 8, **kw: object) -> BudgetDecision:
    """What the governor's handler does: decide, then lease."""
    ledger = ledger or BudgetLedger(run_id="r")
    d = evaluate(r, ledger, **rule(**kw))
    d.lease = lease_for(r, ledger, d, turns=turns, seconds=5.0, **rule(**kw))
    ledger.last_turn, ledger.leased_to = r.turn, d.lease.until_turn if d.lease else 0
    return d


def test_a_plain_allow_is_leased_for_the_next_turns_within_bounds_above_where_the_run_is() -> None:
    d = granted(req(1, history=1000, tokens=5000, usd=0.01))
    assert d.action == "allow" and d.lease is not None
    lease = d.lease
    assert lease.until_turn == 9 and lease.expires_in_s == 5.0
    assert lease.max_history_tokens > 1000 and lease.max_spent_tokens > 5000 and lease.max_spent_usd > 0.01
    # tight on the spend: one token more, at the history bound, is the warning the rule gives there
    s = req(2, history=lease.max_history_tokens, tokens=lease.max_spent_tokens + 1, usd=0.01)
    assert evaluate(s, BudgetLedger(run_id="r"), **rule()).action == "warn"


@settings(max_examples=300, deadline=None)
@given(
    history=st.integers(0, 12_000),
    tokens=st.integers(0, 150_000),
    usd=st.floats(0, 0.99),
    calibration=st.floats(0.5, 3.0),
    reserve=st.sampled_from([0.0, 0.05, 0.3]),
    warned=st.booleans(),
    fallback=st.booleans(),
    at=st.floats(0, 1),
    cache=st.sampled_from(["none", "write", "warm"]),
    last_model=st.sampled_from([MODEL, "", "claude-haiku-4-5"]),
)
def test_every_request_inside_a_lease_is_what_the_rule_allows_the_same(
    history: int,
    tokens: int,
    usd: float,
    calibration: float,
    reserve: float,
    warned: bool,
    fallback: bool,
    at: float,
    cache: str,
    last_model: str,
) -> None:
    ledger = BudgetLedger(run_id="r", fired=["warn"] if warned else [], fallback_active=fallback)
    kw = {"calibration": calibration, "wrap_up_reserve_usd": reserve}
    first = req(1, history=history, tokens=tokens, usd=usd)
    d = granted(first, ledger, **kw)
    if d.lease is None:
        return
    lease = d.lease
    assert d.action == "allow" and not d.reasons and not d.fired
    # any point between where the run is and the bounds, whatever the prompt cache did meanwhile
    inside = req(
        5,
        history=history + round(at * (lease.max_history_tokens - history)),
        tokens=tokens + round(at * (lease.max_spent_tokens - tokens)),
        usd=min(lease.max_spent_usd, usd + at * (lease.max_spent_usd - usd)),
    )
    later = ledger.model_copy(deep=True)
    later.last_model = last_model
    later.last_call = {
        "none": Usage(),
        "write": Usage(input_tokens=900, cache_creation_input_tokens=900),
        "warm": Usage(input_tokens=9000, cache_read_input_tokens=8000),
    }[cache]
    again = evaluate(inside, later, **rule(**kw))
    assert (again.action, again.model, again.max_output_tokens, again.reasons, again.fired) == (
        "allow",
        d.model,
        d.max_output_tokens,
        [],
        [],
    )


@pytest.mark.parametrize(
    ("why", "r", "kw"),
    [
        ("the turn warned", req(1, tokens=139_000), {}),
        ("the turn compacts", req(1, history=9000), {}),
        ("a wrap-up turn", req(1, wrap_up=True), {}),
        ("near the cost ceiling: the history's growth would not fit", req(1, usd=0.97), {}),
        ("waiting on a warm cache says why", req(1, history=9000), {}),
        ("leases are off", req(1), {"turns": 0}),
    ],
)
def test_no_lease_where_the_rule_has_something_to_say_or_leases_are_off(
    why: str, r: BudgetRequest, kw: dict[str, int]
) -> None:
    ledger = BudgetLedger(run_id="r")
    if "warm" in why:
        ledger.last_call = Usage(input_tokens=9000, cache_read_input_tokens=8000)
    d = granted(r, ledger, **kw)
    assert d.lease is None, why
    if "ceiling" in why:
        assert d.action == "allow" and not d.reasons  # the turn itself is a plain allow


# --- the calls made on a lease: the governor's samples -------------------------------------------------------


def test_the_calls_made_on_a_lease_are_each_a_calibration_sample_and_the_spend_between_is_none() -> None:
    ledger = BudgetLedger(run_id="r")
    d = granted(req(1), ledger)
    assert d.lease is not None and ledger.leased_to == 9
    calls = [
        LeasedCall(turn=2, prompt_tokens=2400, usage=Usage(input_tokens=2640)),
        LeasedCall(turn=3, prompt_tokens=2500, usage=Usage(input_tokens=2500, cache_read_input_tokens=2000)),
        LeasedCall(turn=4, prompt_tokens=2600, usage=Usage(input_tokens=100)),  # far off: not a tokenizer's
    ]
    samples = observe(ledger, req(5, tokens=7640, leased=calls))
    assert samples == [(MODEL, pytest.approx(1.1)), (MODEL, pytest.approx(1.0))]
    assert ledger.last_call == calls[2].usage and ledger.last_spent.input_tokens == 7640
    # turns taken on a lease another replica held (nothing reported): the growth of the spend is no sample
    ledger = BudgetLedger(run_id="r")
    granted(req(1), ledger)
    assert observe(ledger, req(5, tokens=9000)) == []
    # the turn right after the lease was given took none on it: the growth is the last call's, as always
    ledger = BudgetLedger(run_id="r")
    granted(req(1), ledger)
    assert observe(ledger, req(2, tokens=2530)) == [(MODEL, pytest.approx(1.1))]


# --- the planner's side ---------------------------------------------------------------------------------------


def held(now: float = 100.0) -> tuple[Leases, BudgetDecision]:
    leases, first = Leases(), req(1, tokens=1000, usd=0.01)
    d = granted(first)
    leases.decided(first, d, now=now)
    return leases, d


def test_a_turn_inside_the_lease_is_allowed_without_asking_and_its_call_reported_with_the_next_ask() -> None:
    leases, d = held()
    assert d.lease is not None
    allowed = leases.allow(req(2, history=1100, tokens=3500, usd=0.02), now=101.0)
    assert allowed is not None and allowed.turn == 2 and allowed.action == "allow" and allowed.lease is None
    assert (allowed.model, allowed.max_output_tokens) == (d.model, d.max_output_tokens)
    leases.called("r", 2, Usage(input_tokens=2500, output_tokens=40))
    leases.called("r", 2, Usage(input_tokens=2500, output_tokens=40))  # the same turn taken again: one call
    asking = leases.asking(req(10, history=1900, tokens=30_000, usd=0.2))
    assert asking.leased == [LeasedCall(turn=2, prompt_tokens=2400, usage=Usage(input_tokens=2500, output_tokens=40))]
    leases.decided(asking, granted(asking), now=102.0)  # the new answer's lease replaces it, with no calls yet
    held_now = leases.held("r")
    assert held_now is not None and held_now.calls == [] and held_now.asked is asking


@pytest.mark.parametrize(
    ("why", "turn", "change", "now"),
    [
        ("expired", 2, {}, 105.5),
        ("past its last turn", 10, {}, 101.0),
        ("the turn it was given on", 1, {}, 101.0),
        ("a wrap-up turn", 2, {"wrap_up": True}, 101.0),
        ("the history past its bound", 2, {"history": 10**6}, 101.0),
        ("the spent tokens past theirs", 2, {"tokens": 10**7}, 101.0),
        ("the spent cost past its", 2, {"usd": 0.99}, 101.0),
        ("another model", 2, {"model": "claude-haiku-4-5"}, 101.0),
        ("other tools offered", 2, {"tools": 900}, 101.0),
        ("another system prompt", 2, {"goal": 600}, 101.0),
        ("another reply size", 2, {"output": 2000}, 101.0),
        ("another tenant", 2, {"tenant": "acme"}, 101.0),
    ],
)
def test_a_turn_outside_the_lease_asks(why: str, turn: int, change: dict[str, object], now: float) -> None:
    leases, _ = held(now=100.0)
    r = req(turn, **{k: v for k, v in change.items() if k in ("history", "tokens", "usd", "wrap_up")})  # type: ignore[arg-type]
    sections = {k: v for k, v in change.items() if k in ("tools", "goal", "output")}
    other = {k: v for k, v in change.items() if k in ("model", "tenant")}
    r = r.model_copy(update={"sections": r.sections.model_copy(update=sections), **other})
    assert leases.allow(r, now=now) is None, why
    assert leases.allow(req(2), now=101.0) is not None  # and the lease still holds for a turn inside it


def test_an_answer_without_a_lease_ends_the_one_held() -> None:
    leases, _ = held()
    later = req(10, tokens=150_000)
    d = evaluate(later, BudgetLedger(run_id="r"), **rule())
    assert d.lease is None
    leases.decided(later, d, now=101.0)
    assert leases.held("r") is None and leases.allow(req(11), now=101.0) is None
