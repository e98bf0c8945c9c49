"""Exponential backoff with full jitter, honouring Retry-After, bounded by attempts and time.

One pure function used by every retrying layer (the executor for tools, the planner and
the judge for model calls), so each failure is retried by exactly one layer, the same way.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class BackoffPolicy:
    max_attempts: int
    base_delay_s: float
    max_delay_s: float
    max_elapsed_s: float


def next_delay(
    policy: BackoffPolicy,
    attempt: int,
    elapsed_s: float,
    retry_after_s: float | None = None,
    rng: random.Random | None = None,
) -> float | None:
    """Seconds to wait before attempt ``attempt + 1``, or ``None`` when the budget is spent.

    ``attempt`` is the number of attempts made so far (1 after the first failure).
    Full jitter: uniform in ``[0, min(max_delay, base * 2**(attempt-1))]``; a server's
    Retry-After is a floor, not a suggestion.
    """
    if attempt >= policy.max_attempts:
        return None
    ceiling = min(policy.max_delay_s, policy.base_delay_s * (2 ** (attempt - 1)))
    delay = (rng or random).uniform(0.0, ceiling)
    if retry_after_s is not None:
        delay = max(delay, retry_after_s)
    if elapsed_s + delay > policy.max_elapsed_s:
        return None
    return delay
