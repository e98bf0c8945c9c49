"""Rate-limit headers, per provider: what each answer announces, read into our dimensions."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from shared.ratelimit.headers import Reading, announced, go_duration, kept, retry_after, rfc3339

NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC).timestamp()


# --- Anthropic ---------------------------------------------------------------------------------------


def test_anthropic_announces_requests_input_and_output_tokens_with_their_reset_times() -> None:
    said = announced(
        "anthropic",
        {
            "anthropic-ratelimit-requests-limit": "50",
            "anthropic-ratelimit-requests-remaining": "49",
            "anthropic-ratelimit-requests-reset": "2026-03-01T12:00:01Z",
            "anthropic-ratelimit-input-tokens-limit": "30000",
            "anthropic-ratelimit-input-tokens-remaining": "29000",
            "anthropic-ratelimit-input-tokens-reset": "2026-03-01T12:00:02Z",
            "anthropic-ratelimit-output-tokens-limit": "8000",
            "anthropic-ratelimit-output-tokens-remaining": "8000",
            "anthropic-ratelimit-output-tokens-reset": "2026-03-01T12:00:00Z",
            "anthropic-ratelimit-tokens-limit": "8000",  # the tightest of the two: not a limit of its own
            "anthropic-ratelimit-tokens-remaining": "8000",
        },
        NOW,
    )
    assert said.readings["requests"] == Reading(limit=50, remaining=49, reset_at=NOW + 1)
    assert said.readings["input_tokens"] == Reading(limit=30000, remaining=29000, reset_at=NOW + 2)
    assert said.readings["output_tokens"].limit == 8000
    assert "tokens" not in said.readings
    assert said.limits == {"requests": 50, "input_tokens": 30000, "output_tokens": 8000}
    assert said.retry_after_s is None


def test_anthropic_combined_tokens_count_when_no_input_or_output_limit_is_announced() -> None:
    said = announced(
        "anthropic",
        {"anthropic-ratelimit-tokens-limit": "100000", "anthropic-ratelimit-tokens-remaining": "5"},
        NOW,
    )
    assert said.limits == {"tokens": 100000}


def test_a_429_says_how_long_to_wait_and_names_are_read_whatever_their_case() -> None:
    said = announced("anthropic", {"Retry-After": "12", "Anthropic-RateLimit-Requests-Remaining": "0"}, NOW)
    assert said.retry_after_s == 12
    assert said.readings["requests"] == Reading(remaining=0)


def test_a_value_that_does_not_parse_is_left_out_not_a_failed_call() -> None:
    said = announced(
        "anthropic",
        {
            "anthropic-ratelimit-requests-limit": "many",
            "anthropic-ratelimit-requests-remaining": "-3",
            "anthropic-ratelimit-requests-reset": "soon",
            "anthropic-ratelimit-input-tokens-limit": "nan",
            "retry-after": "later",
        },
        NOW,
    )
    assert said.readings == {} and said.retry_after_s is None


# --- OpenAI and compatible servers ----------------------------------------------------------------------


def test_openai_announces_requests_and_tokens_with_go_durations_until_reset() -> None:
    said = announced(
        "openai",
        {
            "x-ratelimit-limit-requests": "500",
            "x-ratelimit-remaining-requests": "499",
            "x-ratelimit-reset-requests": "120ms",
            "x-ratelimit-limit-tokens": "30000",
            "x-ratelimit-remaining-tokens": "29500",
            "x-ratelimit-reset-tokens": "6m0s",
        },
        NOW,
    )
    requests = said.readings["requests"]
    assert (requests.limit, requests.remaining) == (500, 499)
    assert requests.reset_at == pytest.approx(NOW + 0.12, abs=1e-6)
    assert said.readings["tokens"] == Reading(limit=30000, remaining=29500, reset_at=NOW + 360)
    assert said.limits == {"requests": 500, "tokens": 30000}


def test_openai_retry_after_ms_wins_over_retry_after() -> None:
    assert announced("openai", {"retry-after-ms": "250", "retry-after": "1"}, NOW).retry_after_s == 0.25


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1s", 1.0), ("6m0s", 360.0), ("20ms", 0.02), ("1h2m3.5s", 3723.5), ("0s", 0.0), ("2.5", 2.5), ("750us", 75e-5)],
)
def test_go_durations(text: str, seconds: float) -> None:
    assert go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "s", "1x", "m1", "-1s", "1s garbage"])
def test_go_durations_that_are_not(text: str) -> None:
    assert go_duration(text) is None


def test_retry_after_may_be_an_http_date() -> None:
    assert retry_after({"retry-after": "Sun, 01 Mar 2026 12:00:30 GMT"}, NOW) == pytest.approx(30)
    assert retry_after({"retry-after": "Sun, 01 Mar 2026 11:00:00 GMT"}, NOW) == 0  # past: go now


def test_rfc3339_needs_a_zone() -> None:
    assert rfc3339("2026-03-01T12:00:01+00:00") == NOW + 1
    assert rfc3339("2026-03-01T12:00:01") is None


def test_providers_keep_only_the_headers_a_reader_looks_at() -> None:
    got = kept(
        {
            "Content-Type": "application/json",
            "anthropic-ratelimit-requests-limit": "5",
            "X-RateLimit-Limit-Requests": "7",
            "retry-after": "1",
            "request-id": "req_1",
        }
    )
    assert got == {"anthropic-ratelimit-requests-limit": "5", "x-ratelimit-limit-requests": "7", "retry-after": "1"}


def test_a_provider_without_a_reader_announces_only_its_retry_after() -> None:
    said = announced("scripted", {"retry-after": "2", "anthropic-ratelimit-requests-limit": "5"}, NOW)
    assert said.readings == {} and said.retry_after_s == 2
