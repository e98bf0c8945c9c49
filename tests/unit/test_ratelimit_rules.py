"""The fleet's share of a provider key as rules (``shared/ratelimit/bucket.py``): each rule on its own,
with the time passed in."""

from __future__ import annotations

import pytest

from shared.ratelimit.bucket import (
    AwaitProbe,
    Configured,
    Cost,
    Go,
    KeyRecord,
    TooLong,
    Used,
    Wait,
    account_of,
    effective,
    limits_of,
    pause,
    reserve,
    settle,
    view,
)
from shared.ratelimit.headers import Announced, Dimension, Reading

T0 = 1_000_000.0
PER_S_10 = Announced(readings={"requests": Reading(limit=600, remaining=600)})  # 10 requests a second
SMALL = Cost(input_tokens=100)


def slots(record: KeyRecord, n: int, now: float, cost: Cost = SMALL, **kw: float) -> tuple[list[float], KeyRecord]:
    """Reserve ``n`` calls at ``now``: when each may go."""
    out: list[float] = []
    limits = limits_of(record, None)
    for _ in range(n):
        decision, new = reserve(
            record,
            now,
            cost,
            limits,
            burst_s=kw.get("burst_s", 0.0),
            bound_s=kw.get("bound_s", 600.0),
            probe_s=kw.get("probe_s", 30.0),
        )
        assert new is not None, decision
        record = new
        out.append(now if isinstance(decision, Go) else decision.until)  # type: ignore[union-attr]
    return out, record


def learned(said: Announced = PER_S_10, now: float = T0) -> KeyRecord:
    record = KeyRecord(provider="anthropic", account="a" * 12)
    return settle(record, now, said, {}, None, estimated=SMALL, raw_estimate=100, used=None)


# --- pacing -------------------------------------------------------------------------------------------


def test_calls_are_paced_at_the_learned_rate_whichever_replica_reserves() -> None:
    times, _ = slots(learned(), 5, T0)
    assert times == pytest.approx([T0, T0 + 0.1, T0 + 0.2, T0 + 0.3, T0 + 0.4])


def test_an_idle_key_gives_no_credit_beyond_the_burst() -> None:
    _, record = slots(learned(), 3, T0)
    later = T0 + 60  # idle a minute: the next call goes at once, and the one after is paced again
    times, _ = slots(record, 2, later)
    assert times == pytest.approx([later, later + 0.1])


def test_a_burst_lets_that_many_seconds_of_the_limit_go_at_once() -> None:
    times, _ = slots(learned(), 12, T0, burst_s=1.0)
    assert times[:11] == [T0] * 11  # the first second's ten, and one more (GCRA: the TAT is one call ahead)
    assert times[11] == pytest.approx(T0 + 0.1)


def test_the_tightest_dimension_sets_the_pace() -> None:
    said = Announced(
        readings={"requests": Reading(limit=600), "input_tokens": Reading(limit=1_200_000)}  # 10/s, 20,000/s
    )
    times, _ = slots(learned(said), 3, T0, cost=Cost(input_tokens=5000))  # 4 calls a second by tokens
    assert times == pytest.approx([T0, T0 + 0.25, T0 + 0.5])
    decision, _ = reserve(
        learned(said), T0, Cost(5000), limits_of(learned(said), None), burst_s=0, bound_s=60, probe_s=30
    )
    assert isinstance(decision, Go)


def test_a_wait_past_the_bound_is_refused_and_reserves_nothing() -> None:
    _, record = slots(learned(), 50, T0)  # the next slot is 5 s away
    decision, new = reserve(record, T0, SMALL, limits_of(record, None), burst_s=0, bound_s=2.0, probe_s=30)
    assert isinstance(decision, TooLong) and decision.wait_s == pytest.approx(5.0)
    assert decision.dimension == "requests" and decision.reason == "capacity"
    assert new is None


# --- first contact ------------------------------------------------------------------------------------


def test_a_key_never_answered_sends_one_probe_and_the_others_wait_for_what_it_teaches() -> None:
    blank = KeyRecord(provider="anthropic", account="b" * 12)
    first, probing = reserve(blank, T0, SMALL, {}, burst_s=0, bound_s=600, probe_s=30)
    assert first == Go(probe=True) and probing is not None and probing.probing_until == T0 + 30
    second, nothing = reserve(probing, T0 + 0.01, SMALL, {}, burst_s=0, bound_s=600, probe_s=30)
    assert second == AwaitProbe(T0 + 30) and nothing is None
    answered = settle(probing, T0 + 0.5, PER_S_10, {}, None, estimated=SMALL, raw_estimate=100, used=Used(100, 10))
    assert answered.probing_until == 0
    times, _ = slots(answered, 2, T0 + 0.5)
    assert times == pytest.approx([T0 + 0.6, T0 + 0.7])  # the probe's own request was charged when learned


def test_a_probe_that_never_answers_lets_another_call_probe_after_its_time() -> None:
    blank = KeyRecord(provider="anthropic", account="b" * 12)
    _, probing = reserve(blank, T0, SMALL, {}, burst_s=0, bound_s=600, probe_s=30)
    assert probing is not None
    again, _ = reserve(probing, T0 + 31, SMALL, {}, burst_s=0, bound_s=600, probe_s=30)
    assert again == Go(probe=True)


def test_a_provider_that_announces_nothing_is_not_limited() -> None:
    blank = KeyRecord(provider="openai", account="c" * 12)
    _, probing = reserve(blank, T0, SMALL, {}, burst_s=0, bound_s=600, probe_s=30)
    assert probing is not None
    silent = settle(probing, T0 + 1, Announced(), {}, None, estimated=SMALL, raw_estimate=100, used=Used(100, 10))
    assert silent.headerless
    times, _ = slots(silent, 3, T0 + 1)
    assert times == [T0 + 1] * 3


# --- what an answer teaches -------------------------------------------------------------------------------


def test_reported_input_tokens_correct_the_estimate_and_output_tokens_are_charged_after() -> None:
    said = Announced(readings={"input_tokens": Reading(limit=60_000), "output_tokens": Reading(limit=6_000)})
    record = learned(said)  # 1,000 input and 100 output tokens a second
    limits = limits_of(record, None)
    _, reserved = reserve(record, T0, Cost(1000), limits, burst_s=0, bound_s=60, probe_s=30)
    assert reserved is not None and reserved.tat["input_tokens"] == pytest.approx(T0 + 1.0)
    answered = settle(reserved, T0, said, limits, None, estimated=Cost(1000), raw_estimate=1000, used=Used(1500, 200))
    assert answered.tat["input_tokens"] == pytest.approx(T0 + 1.5)  # 500 more than estimated
    assert answered.tat["output_tokens"] == pytest.approx(T0 + 2.0)  # 200 output tokens at 100 a second
    assert answered.calibration == pytest.approx(0.8 + 0.2 * 1.5)
    over = settle(reserved, T0, said, limits, None, estimated=Cost(1000), raw_estimate=1000, used=Used(400, 0))
    assert over.tat["input_tokens"] == pytest.approx(T0 + 0.4)  # fewer than estimated: given back


def test_a_dimension_the_provider_says_is_spent_waits_for_a_call_to_come_back() -> None:
    record = learned()
    spent = Announced(readings={"requests": Reading(limit=600, remaining=0)})  # another client on the key?
    answered = settle(record, T0, spent, limits_of(record, None), None, estimated=SMALL, raw_estimate=100, used=None)
    times, _ = slots(answered, 1, T0)
    assert times == pytest.approx([T0 + 0.1])


def test_learned_limits_follow_the_latest_answer() -> None:
    record = learned()
    upgraded = Announced(readings={"requests": Reading(limit=6000)})
    record = settle(record, T0 + 5, upgraded, {}, None, estimated=SMALL, raw_estimate=100, used=None)
    assert limits_of(record, None) == {"requests": 6000}


# --- settings -----------------------------------------------------------------------------------------------


def test_a_setting_caps_what_was_learned_and_never_raises_it() -> None:
    record = learned(Announced(readings={"requests": Reading(limit=600), "input_tokens": Reading(limit=1000)}))
    cap = Configured(requests=60, input_tokens=5000)
    assert effective(record, cap) == {"requests": (60, "capped"), "input_tokens": (1000, "learned")}
    limits = limits_of(record, cap)
    _, reserved = reserve(record, T0, Cost(0), limits, burst_s=0, bound_s=60, probe_s=30)
    assert reserved is not None
    decision, _ = reserve(reserved, T0, Cost(0), limits, burst_s=0, bound_s=60, probe_s=30)
    assert isinstance(decision, Wait) and decision.until == pytest.approx(T0 + 1.0)  # 60 a minute, not 600


def test_an_override_replaces_what_was_learned_and_a_setting_alone_needs_no_probe() -> None:
    record = learned()
    assert effective(record, Configured(requests=1200, mode="override")) == {"requests": (1200, "set")}
    blank = KeyRecord(provider="anthropic", account="d" * 12)
    decision, _ = reserve(
        blank, T0, SMALL, limits_of(blank, Configured(requests=60)), burst_s=0, bound_s=60, probe_s=30
    )
    assert decision == Go()  # limited from the first call: nothing to wait for


# --- a 429 ----------------------------------------------------------------------------------------------------


def test_a_429_pauses_the_key_until_retry_after_then_calls_are_paced_again() -> None:
    record = learned()
    paused = pause(record, T0, Announced(retry_after_s=2.0), None)
    assert paused.paused_until == T0 + 2.0 and paused.rejections == 1
    decision, _ = reserve(paused, T0 + 0.5, SMALL, limits_of(paused, None), burst_s=0, bound_s=60, probe_s=30)
    assert isinstance(decision, Wait) and decision.reason == "paused" and decision.until == pytest.approx(T0 + 2.0)
    times, _ = slots(paused, 3, T0 + 0.5)
    assert times == pytest.approx([T0 + 2.0, T0 + 2.1, T0 + 2.2])


def test_a_429_without_retry_after_pauses_until_the_spent_dimension_resets() -> None:
    said = Announced(readings={"requests": Reading(limit=600, remaining=0, reset_at=T0 + 3.0)})
    assert pause(learned(), T0, said, None).paused_until == T0 + 3.0
    assert pause(learned(), T0, Announced(), None).paused_until == T0 + 1.0  # nothing said: a second


def test_a_pause_never_shortens_one_already_written() -> None:
    first = pause(learned(), T0, Announced(retry_after_s=10), None)
    second = pause(first, T0 + 1, Announced(retry_after_s=1), None)
    assert second.paused_until == T0 + 10 and second.rejections == 2


# --- what a person sees -------------------------------------------------------------------------------------


def test_the_view_shows_limits_their_source_what_is_left_and_the_current_wait() -> None:
    said = Announced(readings={"requests": Reading(limit=600, remaining=7), "input_tokens": Reading(limit=1000)})
    _, record = slots(learned(said), 20, T0, cost=Cost(0))
    shown = view(record, Configured(input_tokens=500), T0)
    dims: dict[Dimension, tuple[float, str, float | None]] = {
        d: (v.limit_per_minute, v.source, v.remaining) for d, v in shown.dimensions.items()
    }
    assert dims == {"requests": (600, "learned", 7), "input_tokens": (500, "capped", None)}
    assert shown.wait_s == pytest.approx(2.0) and shown.paused_s == 0


def test_an_account_names_the_endpoint_and_the_key_never_the_key_itself() -> None:
    a = account_of("https://api.anthropic.com", "sk-ant-secret")
    assert len(a) == 12 and "secret" not in a
    assert a == account_of("https://api.anthropic.com/", "sk-ant-secret")
    assert a != account_of("http://127.0.0.1:8765", "sk-ant-secret")
    assert a != account_of("https://api.anthropic.com", "sk-ant-other")


def test_a_429_before_any_limit_is_known_holds_every_call_then_one_probes_again() -> None:
    blank = KeyRecord(provider="anthropic", account="e" * 12)
    _, probing = reserve(blank, T0, SMALL, {}, burst_s=0, bound_s=600, probe_s=30)
    assert probing is not None
    paused = pause(probing, T0 + 0.1, Announced(retry_after_s=2.0), None)
    assert not paused.headerless  # an error's answer without headers says nothing about the key
    held, nothing = reserve(paused, T0 + 0.2, SMALL, {}, burst_s=0, bound_s=600, probe_s=30)
    assert held == AwaitProbe(T0 + 2.1, "paused") and nothing is None
    too_long, _ = reserve(paused, T0 + 0.2, SMALL, {}, burst_s=0, bound_s=1.0, probe_s=30)
    assert isinstance(too_long, TooLong) and too_long.reason == "paused"
    after, _ = reserve(paused, T0 + 2.2, SMALL, {}, burst_s=0, bound_s=600, probe_s=30)
    assert after == Go(probe=True)


def test_an_error_answer_without_headers_does_not_make_a_key_headerless() -> None:
    blank = KeyRecord(provider="anthropic", account="f" * 12)
    failed = settle(blank, T0, Announced(), {}, None, estimated=SMALL, raw_estimate=100, used=None)
    assert not failed.headerless and failed.probing_until == 0


# --- the setting -------------------------------------------------------------------------------------------


def test_the_setting_names_a_provider_or_one_of_its_keys_and_a_bad_entry_by_its_path() -> None:
    from pydantic import ValidationError

    from shared.settings import Settings, describe_settings_error

    s = Settings(rate_limits={"anthropic": {"requests": 50}, "anthropic.0123456789ab": {"requests": 5}})
    assert s.rate_limit_for("anthropic", "0123456789ab") == Configured(requests=5)
    assert s.rate_limit_for("anthropic", "ffffffffffff") == Configured(requests=50)
    assert s.rate_limit_for("openai", "ffffffffffff") is None
    for bad, said in [
        ({"anthropic": {"requests": -5}}, "LW_RATE_LIMITS at anthropic.requests: Input should be greater than 0"),
        ({"gemini": {"requests": 5}}, "gemini: expected a live provider (anthropic, openai)"),
        ({"anthropic.KEY": {"requests": 5}}, "anthropic.KEY: expected a live provider"),
    ]:
        with pytest.raises(ValidationError) as refused:
            Settings(rate_limits=bad)
        assert said in describe_settings_error(refused.value)
