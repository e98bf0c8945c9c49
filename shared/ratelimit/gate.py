"""A model call's wait for its provider key's rate limit: the I/O around the rules of ``bucket.py``.

One ``RateLimiter`` per service process (the planner's, the judge's). A model call gets a ``Gate`` for its
provider (``RateLimiter.gate``; none for the scripted provider, or with ``LW_RATE_LIMIT_FLEET=false``),
which ``complete_with_retry`` asks before each attempt and tells after it:

* ``before``: reserves the call's slot in the key's record in ``lw_ratelimits`` (compare-and-swap; one
  acquisition at a time per key in this replica, so concurrent turns queue here instead of storming the
  CAS), tells the caller when the wait is worth showing (``notice``: the run's ``run.rate_limited``
  event), sleeps until the slot (the handler holds its message under the bus's heartbeat: no delivery
  is spent), and after a sleep checks that no 429 paused the key meanwhile. A wait past the bound raises
  ``RateLimitWait`` (a typed, non-transient provider error: the turn ends with it).
* ``after``: the answer's headers and usage settle the record in the background; a 429 pauses the key for
  every replica before the call is sent again through ``before``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal, TypeVar

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from shared import ids, tokens
from shared import metrics as M
from shared import subjects as S
from shared import telemetry as T
from shared.bus import Unchanged
from shared.messages import RateLimited, RateLimitedDetail
from shared.providers.base import ModelRequest, ModelResponse, ProviderError
from shared.ratelimit.bucket import (
    AwaitProbe,
    Cost,
    Decision,
    Go,
    KeyRecord,
    TooLong,
    Used,
    Wait,
    WaitReason,
    charged_input,
    limits_of,
    pause,
    reserve,
    settle,
)
from shared.ratelimit.headers import Dimension, announced

if TYPE_CHECKING:
    from shared.bus import Bus
    from shared.settings import Settings

log = logging.getLogger("loopwarden.ratelimit")
R = TypeVar("R")
PROBE_POLL_S = 0.25  # while another call learns a new key's limits, look again this often
PROBE_MAX_S = 30.0  # a probe not answered by then (its replica died?) lets another call probe
Purpose = Literal["plan", "summarize", "judge"]
MAX_REJECTIONS = 50  # 429s one call takes through the gate; past that it is an ordinary transient error
LATE_S = 0.5  # a call woken this long after its slot takes a new one (once): late calls must not go together


def estimate_input(request: ModelRequest) -> int:
    """A request's input tokens as the planner counts them (tiktoken; each message's count is cached)."""
    total = tokens.count(request.system)
    total += sum(tokens.count_message(m) for m in request.messages)
    return total + sum(tokens.count_model(t) for t in request.tools)


class RateLimitWait(ProviderError):
    """The call would wait for its key's rate limit past the bound: nothing was reserved, the turn ends."""

    def __init__(self, message: str) -> None:
        super().__init__(message, transient=False, kind="rate_limit_wait")


@dataclass(frozen=True)
class Waiting:
    """A call is about to wait for its key's rate limit (shown on its run)."""

    provider: str
    account: str
    purpose: Purpose
    wait_s: float
    until: float  # epoch seconds
    reason: WaitReason
    dimension: Dimension | None

    def event(self, run_id: str, iteration: int) -> RateLimited:
        """The run event that says so (``run.rate_limited``), and how long."""
        detail = RateLimitedDetail(
            provider=self.provider,
            account=self.account,
            purpose=self.purpose,
            wait_s=round(self.wait_s, 3),
            until=datetime.fromtimestamp(self.until, UTC),
            reason=self.reason,
            dimension=self.dimension,
        )
        return RateLimited(
            run_id=run_id,
            iteration=iteration,
            summary=f"waiting for the rate limit: {self.wait_s:.1f}s ({self.provider} key {self.account}, "
            f"{detail.cause})",
            detail=detail,
        )


Notice = Callable[[Waiting], Awaitable[None]]


def shown_on(bus: Bus, run_id: str, iteration: Callable[[], int]) -> Notice:
    """A wait shown on its run: the ``run.rate_limited`` event (each wait its own event; ``iteration``: the
    run's iteration when the wait begins)."""

    async def show(w: Waiting) -> None:
        await bus.publish(
            S.run_event("rate_limited"),
            w.event(run_id, iteration()),
            msg_id=ids.rate_limited(run_id),
            run_id=run_id,
        )

    return show


@dataclass(frozen=True)
class Ticket:
    """What ``before`` reserved, for ``after`` to settle."""

    cost: Cost
    raw_estimate: int
    limits: dict[Dimension, float]
    probe: bool = False  # the key's first call: the fleet waits for what its answer teaches


class RateLimiter:
    """This process's access to the fleet's rate-limit records (``lw_ratelimits``), with its metrics."""

    def __init__(self, bus: Bus, settings: Settings, meter: Meter, clock: Callable[[], float] = time.time) -> None:
        self.bus, self.settings, self.clock = bus, settings, clock
        self._locks: dict[str, asyncio.Lock] = {}
        self._known: dict[str, tuple[KeyRecord, int]] = {}  # per key: what this replica last stored or read
        self._seen: dict[str, KeyRecord] = {}  # per key: the latest record seen (the gauges read it)
        self._settling: set[asyncio.Task[None]] = set()
        self._probe_waits: dict[str, asyncio.Lock] = {}
        self.waits = meter.create_histogram(
            M.RATELIMIT_WAIT,
            unit="s",
            description="a model call's wait for its provider key's rate limit",
            explicit_bucket_boundaries_advisory=M.WAIT_BUCKETS_S,
        )
        self.rejections = meter.create_counter(
            M.RATELIMIT_REJECTIONS, description="429s answered by a provider (each pauses its key)"
        )
        self.gave_up = meter.create_counter(
            M.RATELIMIT_GAVE_UP, description="model calls that would have waited past the bound"
        )
        self.late = meter.create_counter(
            M.RATELIMIT_LATE,
            description="model calls woken well after their slot (a busy or starved event loop) that took another",
        )
        meter.create_observable_gauge(
            M.RATELIMIT_REMAINING,
            callbacks=[self._remaining],
            description="what the provider last announced is left, per key and dimension",
        )
        meter.create_observable_gauge(
            M.RATELIMIT_LIMIT,
            callbacks=[self._limits],
            description="the per-minute limit in force (learned or set), per key and dimension",
        )

    def gate(
        self, provider: object, *, purpose: Purpose, max_wait_s: float, notice: Notice | None = None
    ) -> Gate | None:
        """The gate for one model call to ``provider`` (None: it is not rate limited here)."""
        account = getattr(provider, "account", None)
        name = getattr(provider, "name", "")
        if not self.settings.rate_limit_fleet or not isinstance(account, str) or not account:
            return None
        return Gate(self, str(name), account, purpose, min(max_wait_s, self.settings.rate_limit_max_wait_s), notice)

    # --- the record ------------------------------------------------------------------------------
    async def update(self, provider: str, account: str, change: Callable[[KeyRecord], tuple[KeyRecord | None, R]]) -> R:
        """Apply ``change`` to the key's record under compare-and-swap, one at a time in this replica;
        ``change`` returns the new record (None: nothing to write) and a result."""
        key = S.kv_key(provider, account)
        lock = self._locks.setdefault(key, asyncio.Lock())

        def step(stored: KeyRecord | None) -> tuple[KeyRecord, R] | Unchanged[R]:
            new, result = change(stored or KeyRecord(provider=provider, account=account))
            return Unchanged(result) if new is None else (new, result)

        async with lock:
            return await self.bus.update(
                S.KV_RATE_LIMITS, key, KeyRecord, step, known=self._known.pop(key, None), saved=self._keep(key)
            )

    def _keep(self, key: str) -> Callable[[KeyRecord | None, int], None]:
        def saved(record: KeyRecord | None, revision: int) -> None:
            if record is not None:
                self._known[key] = (record, revision)
                self._seen[key] = record

        return saved

    def kept(self, provider: str, account: str) -> KeyRecord | None:
        """The key's record as this replica last stored or read it (it may be behind: for a hint only)."""
        known = self._known.get(S.kv_key(provider, account))
        return known[0] if known is not None else None

    def probe_wait(self, provider: str, account: str) -> asyncio.Lock:
        """Held by the one caller per key that watches for a probe's answer (``Gate.await_probe``)."""
        return self._probe_waits.setdefault(S.kv_key(provider, account), asyncio.Lock())

    async def read(self, provider: str, account: str) -> KeyRecord | None:
        key = S.kv_key(provider, account)
        record, revision = await self.bus.kv_get(S.KV_RATE_LIMITS, key, KeyRecord)
        if record is not None:
            self._keep(key)(record, revision)
        return record

    def background(self, work: Awaitable[None], what: str) -> None:
        """Settle a record after the answer without holding the call up; a failure is logged (the next
        call's record is only less exact)."""

        async def run() -> None:
            try:
                await work
            except Exception as err:
                log.warning("rate limit: could not %s: %r", what, err)

        task = asyncio.create_task(run())
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    # --- gauges ----------------------------------------------------------------------------------
    def _attrs(self, record: KeyRecord, dim: Dimension) -> dict[str, str]:
        return {T.GEN_AI_PROVIDER_NAME: record.provider, T.LW_RATELIMIT_ACCOUNT: record.account, "dimension": dim}

    def _remaining(self, options: CallbackOptions) -> Iterable[Observation]:
        for record in list(self._seen.values()):
            for dim, reading in record.announced.items():
                if reading.remaining is not None:
                    yield Observation(reading.remaining, self._attrs(record, dim))

    def _limits(self, options: CallbackOptions) -> Iterable[Observation]:
        for record in list(self._seen.values()):
            configured = self.settings.rate_limit_for(record.provider, record.account)
            for dim, per_minute in limits_of(record, configured).items():
                yield Observation(per_minute, self._attrs(record, dim))


class Gate:
    """One model call's passage through its key's rate limit (``shared.providers.base.CallGate``)."""

    def __init__(
        self,
        limiter: RateLimiter,
        provider: str,
        account: str,
        purpose: Purpose,
        max_wait_s: float,
        notice: Notice | None,
    ) -> None:
        self.limiter, self.provider, self.account, self.purpose = limiter, provider, account, purpose
        self.max_wait_s, self.notice = max_wait_s, notice
        self.waited_s = 0.0
        self.rejected = 0
        self.configured = limiter.settings.rate_limit_for(provider, account)
        self.attrs = {T.GEN_AI_PROVIDER_NAME: provider, T.LW_RATELIMIT_ACCOUNT: account}

    async def before(self, request: ModelRequest) -> Ticket:
        """Wait for the call's slot (reserved fleet-wide), then let it go."""
        lim, s = self.limiter, self.limiter.settings
        raw = estimate_input(request)
        waited, reason_waited, woke_late = 0.0, "none", False
        while True:
            started = lim.clock()
            kept = lim.kept(self.provider, self.account)
            decision, _, ticket = self.decide(kept, raw) if kept is not None else (None, None, None)
            if not isinstance(decision, AwaitProbe):  # a probe this replica knows is out needs no write to wait

                def take(record: KeyRecord) -> tuple[KeyRecord | None, tuple[Decision, Ticket]]:
                    decision, new, ticket = self.decide(record, raw)
                    return new, (decision, ticket)

                decision, ticket = await lim.update(self.provider, self.account, take)
            assert ticket is not None
            match decision:
                case Go():
                    break
                case TooLong(wait_s=wait, reason=reason, dimension=dim):
                    lim.gave_up.add(1, self.attrs)
                    what = reason if reason != "capacity" else dim
                    raise RateLimitWait(
                        f"the {self.provider} key {self.account} would make this call wait {wait + self.waited_s:.0f}s "
                        f"for its rate limit ({what}), past the bound of {self.max_wait_s:g}s "
                        "(LW_RATE_LIMIT_MAX_WAIT_S, or the run's limits.max_rate_limit_wait_s)"
                    )
                case AwaitProbe(until=until, reason=reason):
                    if self.waited_s >= self.max_wait_s:
                        raise RateLimitWait(
                            f"the {self.provider} key {self.account}'s limits were still being learned after "
                            f"{self.waited_s:.0f}s, the bound (LW_RATE_LIMIT_MAX_WAIT_S)"
                        )
                    if reason != reason_waited and until - started >= s.rate_limit_notice_s:
                        await self.tell(until - started, until, reason, None)
                    reason_waited = reason
                    await self.await_probe(ticket)
                case Wait(until=until, reason=reason, dimension=dim):
                    wait = until - lim.clock()
                    if wait >= s.rate_limit_notice_s:
                        await self.tell(wait, until, reason, dim)
                    await asyncio.sleep(max(0.0, wait))
                    reason_waited = reason
                    record = await lim.read(self.provider, self.account)
                    late = lim.clock() - until  # about to be sent this long after its slot
                    paused = record is not None and record.paused_until > lim.clock()
                    if not paused and (late <= LATE_S or woke_late):
                        waited += lim.clock() - started
                        self.waited_s += lim.clock() - started
                        break
                    # a 429 paused the key while this call waited, or this process woke it late (a busy or
                    # starved event loop): its slot is gone, it takes another rather than go at once
                    # together with the other late ones (a burst the provider would answer 429)
                    woke_late = woke_late or not paused
                    if not paused:
                        lim.late.add(1, self.attrs)
                        log.info(
                            "woke %.2fs after its slot: %s key %s, taking another", late, self.provider, self.account
                        )
            waited += lim.clock() - started
            self.waited_s += lim.clock() - started
        lim.waits.record(waited, {**self.attrs, "reason": reason_waited})
        return ticket

    def decide(self, record: KeyRecord, raw: int) -> tuple[Decision, KeyRecord | None, Ticket]:
        """``bucket.reserve`` for this call on ``record``: the decision, the record to write, the ticket."""
        s = self.limiter.settings
        limits = limits_of(record, self.configured)
        cost = Cost(input_tokens=raw * record.calibration)
        decision, new = reserve(
            record,
            self.limiter.clock(),
            cost,
            limits,
            burst_s=s.rate_limit_burst_s,
            bound_s=max(0.0, self.max_wait_s - self.waited_s),
            probe_s=min(s.model_timeout_s, PROBE_MAX_S),
        )
        return decision, new, Ticket(cost, raw, limits, probe=isinstance(decision, Go) and decision.probe)

    async def await_probe(self, ticket: Ticket) -> None:
        """Until the key's limits are learned (or its probe's time is up): one caller per key in this replica
        watches the record, the others wait their turn behind it and then find the limits known."""
        lim = self.limiter
        async with lim.probe_wait(self.provider, self.account):
            started = lim.clock()
            while self.waited_s + lim.clock() - started < self.max_wait_s:
                kept = lim.kept(self.provider, self.account)  # what the one before in this replica read last
                if kept is not None and not isinstance(self.decide(kept, ticket.raw_estimate)[0], AwaitProbe):
                    return
                record = await lim.read(self.provider, self.account)
                if record is None:
                    return
                decision, _, _ = self.decide(record, ticket.raw_estimate)
                if not isinstance(decision, AwaitProbe):
                    return
                await asyncio.sleep(min(PROBE_POLL_S, max(0.0, decision.until - lim.clock())))

    async def tell(self, wait_s: float, until: float, reason: WaitReason, dim: Dimension | None) -> None:
        log.info(
            "waiting %.1fs for the rate limit of %s key %s (%s, %s call)",
            wait_s,
            self.provider,
            self.account,
            reason if reason != "capacity" else dim,
            self.purpose,
        )
        if self.notice is None:
            return
        try:
            await self.notice(Waiting(self.provider, self.account, self.purpose, wait_s, until, reason, dim))
        except Exception as err:  # the wait is also a metric and a span attribute: the call goes on
            log.warning("rate limit: could not show a wait on the run: %r", err)

    async def after(
        self, ticket: object, response: ModelResponse | None = None, error: ProviderError | None = None
    ) -> bool:
        """Settle the record with what the attempt's answer said; True: a 429 paused the key, send again."""
        assert isinstance(ticket, Ticket)
        lim = self.limiter
        headers = response.headers if response is not None else (error.headers if error is not None else {})
        said = announced(self.provider, headers, lim.clock())
        if error is not None and error.kind == "rate_limit":
            lim.rejections.add(1, self.attrs)
            retry_after = error.retry_after_s

            def paused(record: KeyRecord) -> tuple[KeyRecord | None, None]:
                return pause(record, lim.clock(), said, retry_after), None

            await lim.update(self.provider, self.account, paused)  # every replica sees it before this call retries
            self.rejected += 1
            return self.rejected <= MAX_REJECTIONS
        used = None
        if response is not None:
            u = response.usage
            used = Used(charged_input(self.provider, u.input_tokens, u.cache_read_input_tokens), u.output_tokens)

        def settled(record: KeyRecord) -> tuple[KeyRecord | None, None]:
            new = settle(
                record,
                lim.clock(),
                said,
                ticket.limits,
                self.configured,
                estimated=ticket.cost,
                raw_estimate=ticket.raw_estimate,
                used=used,
            )
            return new, None

        if ticket.probe:  # the fleet waits for what this answer teaches: told at once
            await lim.update(self.provider, self.account, settled)
        else:
            lim.background(lim.update(self.provider, self.account, settled), f"settle {self.provider}.{self.account}")
        return False
