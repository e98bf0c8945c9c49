"""The fleet's share of one provider key, as rules: the record every replica keeps in ``lw_ratelimits``
and what each event does to it. Pure: the time is passed in, nothing here does I/O.

The model is GCRA (a token bucket written as a "theoretical arrival time" per dimension): a dimension
with a limit of ``L`` per minute admits ``L / 60`` units a second; a call of cost ``c`` may go once the
dimension's TAT is at most ``burst_s`` ahead of it, and moves the TAT on by ``c / rate``. A call
*reserves* its slot: it is told when it may go, and waits until then, so the replicas' calls are paced
one after another whichever replica sends them.

* requests cost 1; input tokens the caller's estimate (its tiktoken count times the key's calibration),
  corrected by the reported usage after the call (``settle``); output tokens are charged after the call;
  ``tokens`` (a combined limit) both.
* limits are learned from the answers' headers (``headers.py``) and may be capped or overridden by a
  setting (``Configured``); a dimension with no limit known is not limited.
* a key never answered before is probed: one call goes, the others wait for what its answer teaches.
* a 429 pauses the key for every replica until its ``retry-after`` (``pause``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.ratelimit.headers import DIMENSIONS, WINDOW_S, Announced, Dimension, Reading

MIN_PAUSE_S = 0.05  # a 429's retry-after is honoured as given, but never as "go again at once"
DEFAULT_PAUSE_S = 1.0  # a 429 that says nothing about when to try again
CALIBRATION_WEIGHT = 0.2  # weight of each call's reported/estimated input tokens in the key's ratio
CALIBRATION_RANGE = (0.2, 5.0)


def account_of(base_url: str, api_key: str | None) -> str:
    """A provider key as the fleet names it: 12 hex digits of a hash of the endpoint and the key, so the
    same key on two servers is two accounts, and the key itself is never stored or shown."""
    return hashlib.sha256(f"{base_url.rstrip('/')}\n{api_key or ''}".encode()).hexdigest()[:12]


class Configured(BaseModel):
    """A setting for a provider's keys (``LW_RATE_LIMITS``): per-minute limits that cap what is learned
    (``mode: cap``, the default) or replace it (``override``); a dimension left out stays as learned."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests: float | None = Field(None, gt=0, description="requests per minute")
    input_tokens: float | None = Field(None, gt=0, description="input tokens per minute")
    output_tokens: float | None = Field(None, gt=0, description="output tokens per minute")
    tokens: float | None = Field(None, gt=0, description="input and output tokens per minute, together")
    mode: Literal["cap", "override"] = "cap"

    def value(self, dim: Dimension) -> float | None:
        v: float | None = getattr(self, dim)
        return v


class KeyRecord(BaseModel):
    """One provider key's shared state (``lw_ratelimits``, key ``<provider>.<account>``). Times are epoch
    seconds. Small and fixed in size: every call of every replica rewrites it under compare-and-swap."""

    provider: str
    account: str = Field(description="a short hash of the endpoint and the key: never the key")
    announced: dict[Dimension, Reading] = Field(default_factory=dict, description="the latest reading per dimension")
    seen_at: float = Field(0.0, description="when the latest answer with rate-limit headers came")
    tat: dict[Dimension, float] = Field(default_factory=dict, description="theoretical arrival time per dimension")
    paused_until: float = Field(0.0, description="a 429 paused the key until then")
    probing_until: float = Field(0.0, description="a first call is out to learn the limits, until then at most")
    headerless: bool = Field(False, description="answers carry no rate-limit headers: nothing to learn")
    calibration: float = Field(1.0, description="reported / estimated input tokens, per call (running)")
    rejections: int = Field(0, description="429s answered to the fleet on this key")
    updated_at: float = 0.0

    def learned(self) -> dict[Dimension, float]:
        return {d: r.limit for d, r in self.announced.items() if r.limit is not None and r.limit > 0}


Source = Literal["learned", "set", "capped"]


def effective(record: KeyRecord, configured: Configured | None) -> dict[Dimension, tuple[float, Source]]:
    """The per-minute limit of each limited dimension, and where it comes from."""
    learned = record.learned()
    out: dict[Dimension, tuple[float, Source]] = {}
    for dim in DIMENSIONS:
        got, want = learned.get(dim), configured.value(dim) if configured is not None else None
        if want is None:
            if got is not None:
                out[dim] = (got, "learned")
        elif got is None or (configured is not None and configured.mode == "override"):
            out[dim] = (want, "set")
        else:
            out[dim] = (want, "capped") if want < got else (got, "learned")
    return out


def limits_of(record: KeyRecord, configured: Configured | None) -> dict[Dimension, float]:
    return {d: v for d, (v, _) in effective(record, configured).items()}


@dataclass(frozen=True)
class Cost:
    """What a call is charged before it goes: one request and its (calibrated) input estimate."""

    input_tokens: float

    def of(self, dim: Dimension) -> float:
        match dim:
            case "requests":
                return 1.0
            case "input_tokens" | "tokens":
                return self.input_tokens
            case "output_tokens":
                return 0.0  # charged after the call, when known


# --- what a call is told ---------------------------------------------------------------------------
WaitReason = Literal["capacity", "paused", "first_contact"]


@dataclass(frozen=True)
class Go:
    """Send now (``probe``: as the first call on a key whose limits are not known yet)."""

    probe: bool = False


@dataclass(frozen=True)
class Wait:
    """A slot is reserved at ``until``: send then. ``dimension``: the limit that set it (None: a pause)."""

    until: float
    reason: WaitReason
    dimension: Dimension | None = None


@dataclass(frozen=True)
class AwaitProbe:
    """The key's limits are not known yet and another call is learning them (or a 429 paused the key
    before they were learned): nothing reserved, ask again (by ``until`` at the latest)."""

    until: float
    reason: WaitReason = "first_contact"


@dataclass(frozen=True)
class TooLong:
    """The wait would pass the bound: nothing reserved."""

    wait_s: float
    reason: WaitReason
    dimension: Dimension | None = None


Decision = Go | Wait | AwaitProbe | TooLong


def reserve(
    record: KeyRecord,
    now: float,
    cost: Cost,
    limits: dict[Dimension, float],
    *,
    burst_s: float,
    bound_s: float,
    probe_s: float,
) -> tuple[Decision, KeyRecord | None]:
    """When the call may be sent, and the record with its slot reserved (None: nothing to write)."""
    if not limits and not record.headerless and not record.announced:
        if record.paused_until > now:  # paused before anything was learned: then one call probes again
            if record.paused_until - now > bound_s:
                return TooLong(record.paused_until - now, "paused"), None
            return AwaitProbe(record.paused_until, "paused"), None
        if record.probing_until > now:  # the caller asks again shortly; its own bound counts the time
            return AwaitProbe(record.probing_until), None
        probing = record.model_copy(deep=True)
        probing.probing_until, probing.updated_at = now + probe_s, now
        return Go(probe=True), probing
    grant, binding = now, None
    reason: WaitReason = "capacity"
    if record.paused_until > now:
        grant, reason = record.paused_until, "paused"
    for dim in limits:
        earliest = record.tat.get(dim, 0.0) - burst_s
        if earliest > grant:  # behind a pause, the calls queued after it: still the pause's doing
            grant, binding = earliest, dim
    if grant - now > bound_s:
        return TooLong(grant - now, reason, binding), None
    new = record.model_copy(deep=True)
    for dim, per_minute in limits.items():
        new.tat[dim] = max(record.tat.get(dim, 0.0), grant) + cost.of(dim) * WINDOW_S / per_minute
    new.updated_at = now
    if grant <= now:
        return Go(), new
    return Wait(grant, reason, binding), new


# --- what an answer teaches ------------------------------------------------------------------------
def charged_input(provider: str, input_tokens: int, cache_read_tokens: int) -> int:
    """A call's input tokens as its provider's input limit counts them: Anthropic's does not count the
    prompt cache's reads (our ``Usage.input_tokens`` is the whole prompt, reads included); OpenAI's counts all."""
    return input_tokens - cache_read_tokens if provider == "anthropic" else input_tokens


@dataclass(frozen=True)
class Used:
    """What a call was charged by the provider: input tokens as its input limit counts them (the prompt
    cache's reads do not count for Anthropic's), and output tokens."""

    input_tokens: int
    output_tokens: int


def learn(record: KeyRecord, now: float, said: Announced, answered: bool) -> None:
    """Take the limits an answer announced (in place). A successful answer (``answered``) with no rate-limit
    header at all, on a key that never announced one, marks the key headerless: it is not limited unless a
    setting says so (an error's answer may just lack them)."""
    if said.readings:
        record.announced.update(said.readings)
        record.seen_at, record.headerless = now, False
    elif answered and not record.announced:
        record.headerless = True


def settle(
    record: KeyRecord,
    now: float,
    said: Announced,
    limits_before: dict[Dimension, float],
    configured: Configured | None,
    *,
    estimated: Cost,
    raw_estimate: float,
    used: Used | None,
) -> KeyRecord:
    """The record once a call's answer came: its limits learned, its input estimate corrected by the
    reported usage and its output charged, the key's calibration moved, and any dimension the provider
    says is spent held until one more call's worth has come back."""
    new = record.model_copy(deep=True)
    new.probing_until, new.updated_at = 0.0, now
    learn(new, now, said, answered=used is not None)
    limits = limits_of(new, configured)
    if used is not None:
        spent: dict[Dimension, float] = {
            "input_tokens": used.input_tokens - estimated.input_tokens,
            "output_tokens": float(used.output_tokens),
            "tokens": used.input_tokens - estimated.input_tokens + used.output_tokens,
        }
        for dim, amount in spent.items():
            per_minute = limits.get(dim)
            if per_minute is None:
                continue
            if dim not in limits_before:  # learned from this very answer: nothing was reserved
                amount += estimated.of(dim)
            base = new.tat.get(dim, now) if amount < 0 else max(new.tat.get(dim, 0.0), now)
            new.tat[dim] = base + amount * WINDOW_S / per_minute
        if "requests" in limits and "requests" not in limits_before:
            new.tat["requests"] = max(new.tat.get("requests", 0.0), now) + WINDOW_S / limits["requests"]
        if raw_estimate > 0 and used.input_tokens > 0:
            low, high = CALIBRATION_RANGE
            sample = min(high, max(low, used.input_tokens / raw_estimate))
            new.calibration = round(new.calibration * (1 - CALIBRATION_WEIGHT) + sample * CALIBRATION_WEIGHT, 4)
    for dim, reading in said.readings.items():
        per_minute = limits.get(dim)
        if per_minute is None or reading.remaining is None:
            continue
        need = max(estimated.input_tokens, 1.0) if dim in ("input_tokens", "tokens") else 1.0
        if reading.remaining < need:  # the provider counts more than we did (another client on the key?)
            refill = now + (need - reading.remaining) * WINDOW_S / per_minute
            new.tat[dim] = max(new.tat.get(dim, 0.0), refill)
    return new


def pause(record: KeyRecord, now: float, said: Announced, retry_after_s: float | None) -> KeyRecord:
    """A 429: the key is paused for every replica until the answer's ``retry-after`` (else until the
    spent dimension's reset, else ``DEFAULT_PAUSE_S``), and no slot is given out before then."""
    new = record.model_copy(deep=True)
    new.probing_until, new.updated_at = 0.0, now
    learn(new, now, said, answered=False)
    wait = retry_after_s if retry_after_s is not None else said.retry_after_s
    if wait is None:
        resets = [
            r.reset_at - now
            for r in said.readings.values()
            if r.remaining is not None and r.remaining < 1 and r.reset_at is not None and r.reset_at > now
        ]
        wait = min(max(resets), WINDOW_S) if resets else DEFAULT_PAUSE_S
    new.paused_until = max(new.paused_until, now + max(wait, MIN_PAUSE_S))
    for dim in {*new.tat, *new.learned()}:
        new.tat[dim] = max(new.tat.get(dim, 0.0), new.paused_until)
    new.rejections += 1
    return new


# --- what a person sees --------------------------------------------------------------------------
class DimensionView(BaseModel):
    limit_per_minute: float
    source: Source
    remaining: float | None = Field(None, description="as the provider last announced it")
    reset_at: float | None = None


class KeyView(BaseModel):
    """One provider key as ``loopwarden fleet`` and the console show it."""

    provider: str
    account: str
    dimensions: dict[Dimension, DimensionView] = Field(default_factory=dict)
    wait_s: float = Field(0.0, description="how long a call sent now would wait")
    paused_s: float = Field(0.0, description="how much of that is a 429's pause")
    rejections: int = 0
    calibration: float = 1.0
    seen_at: float = 0.0
    headerless: bool = False


def view(record: KeyRecord, configured: Configured | None, now: float, burst_s: float = 0.0) -> KeyView:
    dims: dict[Dimension, DimensionView] = {}
    for dim, (per_minute, source) in effective(record, configured).items():
        reading = record.announced.get(dim)
        dims[dim] = DimensionView(
            limit_per_minute=per_minute,
            source=source,
            remaining=reading.remaining if reading is not None else None,
            reset_at=reading.reset_at if reading is not None else None,
        )
    ahead = [record.tat.get(d, 0.0) - burst_s for d in dims]
    return KeyView(
        provider=record.provider,
        account=record.account,
        dimensions=dims,
        wait_s=round(max([0.0, record.paused_until - now, *(t - now for t in ahead)]), 3),
        paused_s=round(max(0.0, record.paused_until - now), 3),
        rejections=record.rejections,
        calibration=record.calibration,
        seen_at=record.seen_at,
        headerless=record.headerless,
    )
