"""Backoff: full jitter under an exponential ceiling, Retry-After as a floor, bounded budgets."""

from __future__ import annotations

import random

from shared.backoff import BackoffPolicy, next_delay

POLICY = BackoffPolicy(max_attempts=5, base_delay_s=0.1, max_delay_s=1.0, max_elapsed_s=10.0)


def test_full_jitter_stays_under_the_exponential_ceiling() -> None:
    rng = random.Random(7)
    for attempt in range(1, 5):
        ceiling = min(1.0, 0.1 * 2 ** (attempt - 1))
        delays = [next_delay(POLICY, attempt, 0.0, rng=rng) for _ in range(200)]
        assert all(d is not None and 0 <= d <= ceiling for d in delays)
        assert max(d for d in delays if d is not None) > ceiling * 0.8  # jitter spreads over the range


def test_retry_after_is_a_floor_and_budgets_bound_retries() -> None:
    assert next_delay(POLICY, 1, 0.0, retry_after_s=2.5) == 2.5
    assert next_delay(POLICY, 5, 0.0) is None  # attempts spent
    assert next_delay(POLICY, 1, 9.5, retry_after_s=1.0) is None  # elapsed time spent
