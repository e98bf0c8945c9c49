"""What a person sees of rate limits: a run's current wait (from its events) and a key's lines."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from shared.messages import ModelCalled, ModelCalledDetail, RateLimited, RateLimitedDetail
from shared.ratelimit.bucket import Configured, KeyRecord, view
from shared.ratelimit.fleet import current_wait, describe
from shared.ratelimit.headers import Reading

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def waited(until: datetime, reason: str = "capacity") -> RateLimited:
    return RateLimited(
        run_id="r1",
        iteration=2,
        detail=RateLimitedDetail(
            provider="anthropic",
            account="0123456789ab",
            purpose="plan",
            wait_s=3.0,
            until=until,
            reason=reason,  # type: ignore[arg-type]
            dimension="requests" if reason == "capacity" else None,
        ),
    )


def called() -> ModelCalled:
    return ModelCalled(
        run_id="r1", iteration=2, detail=ModelCalledDetail(input_tokens=1, output_tokens=1, cost_usd=0, model="m")
    )


def test_a_run_waits_until_its_latest_wait_ends_or_the_call_it_held_is_made() -> None:
    later = waited(NOW + timedelta(seconds=3))
    assert current_wait([called(), later], NOW) is later
    assert current_wait([later], NOW + timedelta(seconds=4)) is None  # its time has passed
    assert current_wait([later, called()], NOW) is None  # the turn was answered
    assert current_wait([called()], NOW) is None


def test_a_wait_says_why_in_a_few_words() -> None:
    assert waited(NOW, "capacity").detail.cause == "requests"
    assert waited(NOW, "paused").detail.cause == "paused by a 429"
    assert waited(NOW, "first_contact").detail.cause == "learning its limits"


def test_a_key_is_described_by_its_limits_what_is_left_and_the_wait_now() -> None:
    t = NOW.timestamp()
    record = KeyRecord(
        provider="anthropic",
        account="0123456789ab",
        announced={"requests": Reading(limit=600, remaining=7, reset_at=t + 1)},
        tat={"requests": t + 2.5},
        paused_until=t + 1,
        rejections=3,
    )
    lines = describe(view(record, Configured(input_tokens=30_000), t))
    assert lines[0] == "anthropic key 0123456789ab:"
    assert "600/min (learned), 7 left (full at 12:00:01 UTC)" in lines[1]
    assert "30,000/min (set)" in lines[2]
    assert lines[3].split(";")[0].endswith("wait now       2.5s (paused by a 429 for 1.0s)")
    assert "429s so far 3" in lines[3]


def test_a_key_without_limits_says_so() -> None:
    silent = KeyRecord(provider="openai", account="0123456789ab", headerless=True)
    assert describe(view(silent, None, 0.0)) == [
        "openai key 0123456789ab: the provider announces no rate limit (none set): not limited"
    ]
