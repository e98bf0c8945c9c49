"""What a provider's answer says about its rate limits: its headers, read into our dimensions.

Pure: a header mapping (and the time it was read) in, an ``Announced`` out. Each provider has its own
reader (``READERS``); a value that does not parse is left out, never a failed call.

* Anthropic (``anthropic-ratelimit-<dimension>-<limit|remaining|reset>``): ``requests``, ``input-tokens``,
  ``output-tokens``, and ``tokens`` (the tightest token limit in effect, read only when the API announces
  no input or output limit of its own); ``reset`` is an RFC 3339 time (when the bucket is full again).
* OpenAI and compatible servers (``x-ratelimit-<limit|remaining|reset>-<requests|tokens>``): ``reset`` is a
  duration from now such as ``6m0s``, ``1s`` or ``20ms``; ``tokens`` counts the prompt and the reply.
* Both: ``retry-after`` (seconds, or an HTTP date) and OpenAI's ``retry-after-ms``.

Every limit is per minute, as both providers define them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict

Dimension = Literal["requests", "input_tokens", "output_tokens", "tokens"]
DIMENSIONS: tuple[Dimension, ...] = get_args(Dimension)
WINDOW_S = 60.0  # every announced limit is per minute

ANTHROPIC_PREFIX = "anthropic-ratelimit-"
OPENAI_PREFIX = "x-ratelimit-"
RETRY_AFTER = "retry-after"
RETRY_AFTER_MS = "retry-after-ms"
ANTHROPIC_DIMENSIONS: dict[str, Dimension] = {
    "requests": "requests",
    "input-tokens": "input_tokens",
    "output-tokens": "output_tokens",
    "tokens": "tokens",
}
OPENAI_DIMENSIONS: dict[str, Dimension] = {"requests": "requests", "tokens": "tokens"}
_GO_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class Reading(BaseModel):
    """One dimension as an answer announced it."""

    model_config = ConfigDict(frozen=True)

    limit: float | None = None  # per minute
    remaining: float | None = None
    reset_at: float | None = None  # epoch seconds: when the provider says the limit is replenished


class Announced(BaseModel):
    """What one answer's headers said: a reading per dimension it named, and how long to wait (a 429's)."""

    model_config = ConfigDict(frozen=True)

    readings: dict[Dimension, Reading] = {}
    retry_after_s: float | None = None

    @property
    def limits(self) -> dict[Dimension, float]:
        return {d: r.limit for d, r in self.readings.items() if r.limit is not None and r.limit > 0}


def kept(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers a reader looks at (lower-cased names), from all of an answer's: what a provider keeps."""
    out: dict[str, str] = {}
    for name, value in headers.items():
        low = name.lower()
        if low.startswith((ANTHROPIC_PREFIX, OPENAI_PREFIX)) or low in (RETRY_AFTER, RETRY_AFTER_MS):
            out[low] = value
    return out


def number(value: str | None) -> float | None:
    """A non-negative number, or None."""
    if value is None:
        return None
    try:
        n = float(value.strip())
    except ValueError:
        return None
    return n if n >= 0 and n == n and n != float("inf") else None


def rfc3339(value: str | None) -> float | None:
    """An RFC 3339 time (``2026-01-01T00:00:12Z``) as epoch seconds, or None."""
    if not value:
        return None
    try:
        at = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return at.timestamp() if at.tzinfo is not None else None


def go_duration(value: str | None) -> float | None:
    """A Go-style duration (``6m0s``, ``1s``, ``20ms``, ``1h2m3.5s``) in seconds, or None."""
    if not value:
        return None
    text = value.strip()
    total, end = 0.0, 0
    for match in _GO_DURATION.finditer(text):
        if match.start() != end:
            return None
        total += float(match.group(1)) * _UNIT_S[match.group(2)]
        end = match.end()
    if end != len(text) or end == 0:
        return number(text)  # a bare number of seconds, as some compatible servers send
    return total


def retry_after(headers: Mapping[str, str], now: float) -> float | None:
    """How long the answer asks the caller to wait: ``retry-after-ms``, else ``retry-after`` (seconds or
    an HTTP date), or None."""
    ms = number(headers.get(RETRY_AFTER_MS))
    if ms is not None:
        return ms / 1000
    value = headers.get(RETRY_AFTER)
    seconds = number(value)
    if seconds is not None or not value:
        return seconds
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - now)
    except (TypeError, ValueError, IndexError):
        return None


def read_anthropic(headers: Mapping[str, str], now: float) -> Announced:
    readings: dict[Dimension, Reading] = {}
    for name, dim in ANTHROPIC_DIMENSIONS.items():
        base = f"{ANTHROPIC_PREFIX}{name}-"
        reading = Reading(
            limit=number(headers.get(base + "limit")),
            remaining=number(headers.get(base + "remaining")),
            reset_at=rfc3339(headers.get(base + "reset")),
        )
        if reading != Reading():
            readings[dim] = reading
    if "input_tokens" in readings or "output_tokens" in readings:
        readings.pop("tokens", None)  # the tightest of those two: counted through them
    return Announced(readings=readings, retry_after_s=retry_after(headers, now))


def read_openai(headers: Mapping[str, str], now: float) -> Announced:
    readings: dict[Dimension, Reading] = {}
    for name, dim in OPENAI_DIMENSIONS.items():
        reset = go_duration(headers.get(f"{OPENAI_PREFIX}reset-{name}"))
        reading = Reading(
            limit=number(headers.get(f"{OPENAI_PREFIX}limit-{name}")),
            remaining=number(headers.get(f"{OPENAI_PREFIX}remaining-{name}")),
            reset_at=None if reset is None else now + reset,
        )
        if reading != Reading():
            readings[dim] = reading
    return Announced(readings=readings, retry_after_s=retry_after(headers, now))


READERS: dict[str, Callable[[Mapping[str, str], float], Announced]] = {
    "anthropic": read_anthropic,
    "openai": read_openai,
}


def announced(provider: str, headers: Mapping[str, str], now: float) -> Announced:
    """What ``headers`` (an answer of ``provider``, read at ``now``) say; nothing for a provider with no reader."""
    reader = READERS.get(provider)
    if reader is None:
        return Announced(retry_after_s=retry_after(headers, now))
    return reader({k.lower(): v for k, v in headers.items()}, now)
