"""Governor handlers: one budget decision per (run, turn) asked about, stored, so a retried request gets
the same answer and thresholds fire once (a plain allow may lease the run's next turns: ``budget.lease_for``);
per-model calibration of the token estimate; what each tenant spent today (from budget requests, and from
each run's final usage)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import OrderedDict

from pydantic import BaseModel, Field

from services.governor import ids
from services.governor.budget import BudgetLedger, Rule, evaluate, lease_for, observe, updated_ratio
from shared import metrics as M
from shared import subjects as S
from shared import telemetry as T
from shared.aio import retrieved
from shared.bus import Bus, Unchanged
from shared.flow import Policies, TenantDay, day_key, today
from shared.live_config import LiveConfig
from shared.messages import (
    FINAL_STATUSES,
    BudgetDecision,
    BudgetRequest,
    BudgetThreshold,
    BudgetThresholdKind,
    ErrorReply,
    RunEvent,
    RunFinished,
)
from shared.settings import Settings

THRESHOLD_KINDS: dict[str, BudgetThresholdKind] = {
    "warn": "budget.warn",
    "compact": "budget.compact",
    "block": "budget.block",
    "wrap_up": "budget.wrap_up",
}  # any other threshold that fires is a model fallback
log = logging.getLogger("loopwarden.governor")
KEEP_DECISIONS = 8  # recent turns whose decision a redelivered request gets again
CALIBRATION_KEY = "calibration.models"
PERSIST_EVERY = 8  # calibration samples between writes of the shared ratios
SHARE_EVERY_S = 1.0  # and at most one such write (a read and a compare-and-swap) this often
SPEND_EVERY_S = 0.5  # a tenant's day without a ceiling: its runs' spend written at most this often per replica
SETTLE_EVERY_S = 0.1  # and a run's final total within this (its final event is acked once it is stored)
KEEP_DAYS = 1024  # tenants' days whose record a replica keeps (a write needs no read first)


class Calibration(BaseModel):
    """Per model: reported / estimated input tokens (running), and how many samples it rests on."""

    ratios: dict[str, float] = Field(default_factory=dict)
    samples: dict[str, int] = Field(default_factory=dict)


def share(mine: Calibration, stored: Calibration | None) -> tuple[Calibration, None]:
    """The shared ratios with one replica's merged in: per model averaged by sample count."""
    out = stored or Calibration()
    for m, r in mine.ratios.items():
        n_old, n_new = out.samples.get(m, 0), mine.samples.get(m, 0)
        old = out.ratios.get(m)
        out.ratios[m] = r if old is None else round((old * n_old + r * n_new) / (n_old + n_new), 4)
        out.samples[m] = max(n_old, n_new)
    return out, None


class TenantDays:
    """Each tenant's day (``shared.flow.spend.TenantDay``), kept for every tenant: a replica coalesces what it
    learns of one tenant's day into one compare-and-swap write at a time (every run of a tenant updates the
    same key), tried on the record as this replica last stored it (a conflict reads it again), and a caller that
    needs the total (a tenant with a ceiling) awaits the write that carries its update, made at once; the others
    do not wait for it, and their runs' spend is written at most every ``SPEND_EVERY_S`` (a run's final total
    within ``SETTLE_EVERY_S``: its final event waits for it, and a burst of runs ending would otherwise write the
    day back to back, hundreds of times a second): at one run a step apart, one write in many steps instead of a
    read and a write per step. A lost or not yet made write is made good by the run's next update (each carries
    its latest total) or its final event."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        # per key: the ops not yet written, the day's total once they are, and whether someone waits for it
        self._batches: dict[str, tuple[list[tuple[str, str, float]], asyncio.Future[float], asyncio.Event]] = {}
        self._writers: dict[str, asyncio.Task[None]] = {}
        self._known: OrderedDict[str, tuple[TenantDay, int]] = OrderedDict()  # what this replica last stored
        self._settling: dict[str, asyncio.TimerHandle] = {}  # a batch with a run's final total: written soon
        self.writes = 0  # days this replica stored (the tests count how few a burst takes)

    def add(self, tenant: str, op: str, run_id: str, usd: float, *, now: bool = True) -> asyncio.Future[float]:
        """Queue ``op`` (``spend``: the run's total so far; ``settle``: its final total) for today's record of
        ``tenant``; the future is the day's total once the write that carries it is stored. ``now``: the caller
        waits for that total (written at once); otherwise the write may wait up to ``SPEND_EVERY_S`` for more."""
        day = today()
        key = day_key(tenant, day)
        batch = self._batches.get(key)
        if batch is None:
            batch = self._batches[key] = ([], asyncio.get_running_loop().create_future(), asyncio.Event())
            batch[1].add_done_callback(retrieved)
        batch[0].append((op, run_id, usd))
        if now:
            batch[2].set()
        elif op == "settle" and key not in self._settling:  # written within SETTLE_EVERY_S, not at once
            self._settling[key] = asyncio.get_running_loop().call_later(SETTLE_EVERY_S, batch[2].set)
        writer = self._writers.get(key)
        if writer is None or writer.done():
            self._writers[key] = asyncio.create_task(self._write(key, tenant, day), name=f"governor day {key}")
        return batch[1]

    def keep(self, key: str, record: TenantDay | None, revision: int) -> None:
        if record is None:
            return
        self._known[key] = (record, revision)
        self._known.move_to_end(key)
        while len(self._known) > KEEP_DAYS:
            self._known.popitem(last=False)

    async def _write(self, key: str, tenant: str, day: str) -> None:
        while key in self._batches:
            urgent = self._batches[key][2]
            if not urgent.is_set():  # nobody waits: more of the tenant's spend is gathered into this write
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(SPEND_EVERY_S):
                        await urgent.wait()
            ops, done, _ = self._batches.pop(key)
            timer = self._settling.pop(key, None)
            if timer is not None:
                timer.cancel()

            def change(
                stored: TenantDay | None, ops: list[tuple[str, str, float]] = ops
            ) -> tuple[TenantDay, float] | Unchanged[float]:
                record = stored or TenantDay(tenant=tenant, day=day)
                changed = False
                for op, run_id, usd in ops:
                    changed = (record.settle(run_id, usd) if op == "settle" else record.spend(run_id, usd)) or changed
                return (record, record.spent_usd) if changed else Unchanged(record.spent_usd)

            try:
                total = await self.bus.update(
                    S.KV_BUDGETS,
                    key,
                    TenantDay,
                    change,
                    known=self._known.pop(key, None),
                    saved=lambda record, revision: self.keep(key, record, revision),
                )
                done.set_result(total)
                self.writes += 1
            except Exception as err:
                log.warning("governor: could not store %s: %r", key, err)
                done.set_exception(err)
        self._writers.pop(key, None)


def first_ask(req: BudgetRequest) -> bool:
    """Whether ``req`` is, most likely, its run's first ask: the run has made no model call yet, so no turn of
    it was asked about (a ledger is written only by an ask). A guess that the ledger is absent, never trusted:
    its write is a create, which fails where a ledger exists (a redelivered ask, another replica's), and the
    ledger is then read and decided upon as for any other ask."""
    spent = req.spent
    return not req.leased and spent.input_tokens == 0 and spent.output_tokens == 0 and spent.cost_usd == 0


class Governor:
    def __init__(self, bus: Bus, settings: Settings, telemetry: T.Telemetry) -> None:
        self.bus, self.settings = bus, settings
        self.tracer = telemetry.tracer("loopwarden.governor")
        meter = telemetry.meter("loopwarden.governor")
        self.decisions = M.Tally(meter, M.BUDGET_DECISIONS, description="budget decisions by action")
        self.estimated_cost = M.Tally(
            meter, M.BUDGET_ESTIMATED_COST, unit="USD", description="estimated cost of allowed calls (cache rates)"
        )
        self.tenant_spend = meter.create_counter(M.TENANT_COST, unit="USD", description="spend accounted to tenants")
        # each tenant's UTC day against its ceiling, as this replica last accounted it (read at collection)
        self.spent_today: dict[str, tuple[str, float]] = {}  # tenant -> (day, spent)
        self._tenant_label = M.Bounded()
        M.computed_gauge(
            meter, M.TENANT_SPENT_TODAY, self.spent_rows, unit="USD", description="a tenant's spend today (UTC)"
        )
        M.computed_gauge(
            meter,
            M.TENANT_DAILY_CEILING,
            self.ceiling_rows,
            unit="USD",
            description="what a tenant may spend per UTC day",
        )

        # The ledger this replica last stored per run, with its revision: tried first under CAS
        # (a conflict re-reads), so a turn costs one KV write and no read.
        self._ledgers: OrderedDict[str, tuple[BudgetLedger, int]] = OrderedDict()
        self.calibration: Calibration | None = None
        self._unsaved = 0
        self._shared_at = -SHARE_EVERY_S
        self._share_due = False
        self._sharing: asyncio.Task[None] | None = None
        self.days = TenantDays(bus)
        # each tenant's daily ceiling: the one reader of tenants' policies (LW_TENANTS and lw_config)
        self.policies = Policies(settings, LiveConfig(bus).policies)

    def keep(self, key: str, ledger: BudgetLedger | None, revision: int) -> None:
        if ledger is None:
            return
        self._ledgers[key] = (ledger, revision)
        self._ledgers.move_to_end(key)
        while len(self._ledgers) > 1024:
            self._ledgers.popitem(last=False)

    def register(self) -> None:
        self.bus.responder(
            subject=S.BUDGET_RESERVE,
            model=BudgetRequest,
            reply=lambda reason: ErrorReply(error=reason),  # typed: the planner parses it
        )(self.on_reserve)
        self.bus.consumer(
            durable=S.DURABLE_GOVERNOR_RUN_FINISHED,
            stream=S.STREAM_EVT,
            filter_subjects=[S.any_run(S.run_event(status)) for status in FINAL_STATUSES],
            model=RunEvent,
        )(self.on_run_finished)

    # --- calibration -------------------------------------------------------------------------------
    async def ratio(self, model: str) -> float:
        if self.calibration is None:
            stored, _ = await self.bus.kv_get(S.KV_BUDGETS, CALIBRATION_KEY, Calibration)
            self.calibration = stored or Calibration()
        return self.calibration.ratios.get(model, 1.0)

    def learned(self, model: str, samples: list[tuple[str, float]]) -> float:
        """The ratio for ``model`` with this request's sample counted (not yet stored: ``learn`` does)."""
        cal = self.calibration or Calibration()
        ratio = cal.ratios.get(model)
        for m, sample in samples:
            if m == model:
                ratio = updated_ratio(ratio, sample, self.settings.calibration_weight)
        return ratio if ratio is not None else 1.0

    def learn(self, model: str, sample: float) -> None:
        """Count a sample in this replica's ratios now; share them through the bucket every few samples (at
        most once every ``SHARE_EVERY_S``: at a few hundred turns a second, one read and write in hundreds of
        turns), in the background (the shared ratios only seed other replicas and restarts: a budget answer
        never waits for them)."""
        cal = self.calibration or Calibration()
        self.calibration = cal
        cal.ratios[model] = updated_ratio(cal.ratios.get(model), sample, self.settings.calibration_weight)
        cal.samples[model] = cal.samples.get(model, 0) + 1
        self._unsaved += 1
        if self._unsaved >= PERSIST_EVERY or cal.samples[model] == 1:
            self._unsaved = 0
            self._share_due = True
            if self._sharing is None or self._sharing.done():
                self._sharing = asyncio.create_task(self.share_calibration(), name="governor calibration")

    async def share_calibration(self) -> None:
        """Merge this replica's ratios into the shared ones, again while more became due meanwhile
        (one write in flight at a time), at most one every ``SHARE_EVERY_S``."""
        while self._share_due and self.calibration is not None:
            wait = self._shared_at + SHARE_EVERY_S - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            self._share_due, self._shared_at = False, time.monotonic()
            mine = self.calibration.model_copy(deep=True)
            try:
                await self.bus.update(S.KV_BUDGETS, CALIBRATION_KEY, Calibration, functools.partial(share, mine))
            except Exception as err:  # best effort: the next due sample shares them again
                log.warning("governor: could not share the calibration: %r", err)

    # --- tenants -----------------------------------------------------------------------------------
    def spent(self, tenant: str, day: str, total: float) -> float:
        """Remember ``tenant``'s total of ``day`` for ``loopwarden.tenant.spent_today``; returns it."""
        if tenant in self.spent_today or len(self.spent_today) < M.MAX_LABEL_VALUES:
            self.spent_today[tenant] = (day, total)
        return total

    def spent_rows(self) -> list[tuple[dict[str, str], float]]:
        day = today()
        return [({"tenant": t}, v) for t, (d, v) in list(self.spent_today.items()) if d == day]

    def ceiling_rows(self) -> list[tuple[dict[str, str], float]]:
        """The ceiling of every tenant the settings name and every tenant seen today (the default tenant's too)."""
        s = self.settings
        configured = self.policies.last or {}
        tenants = dict.fromkeys([S.DEFAULT_TENANT, *s.tenants, *configured, *s.tenant_ceilings, *self.spent_today])
        rows = []
        for tenant in tenants:
            ceiling = self.policies.known(tenant).daily_ceiling_usd
            if ceiling is not None:
                rows.append(({"tenant": self._tenant_label(tenant)}, ceiling))
        return rows

    async def tenant_ceiling(self, tenant: str | None) -> float | None:
        """A run without a tenant belongs to the default one, and meets its ceiling."""
        return (await self.policies.of(tenant or S.DEFAULT_TENANT)).daily_ceiling_usd

    def account(self, tenant: str, op: str, run_id: str, usd: float, *, now: bool = True) -> asyncio.Future[float]:
        """The run's spend so far (``spend``) or its final total (``settle``) into its tenant's day, for every
        tenant (ceiling or not: a ceiling set during the day counts the whole day); the future is the day's total
        once stored (also kept for ``loopwarden.tenant.spent_today``); ``now``: it is awaited (not coalesced)."""
        day = today()
        total = self.days.add(tenant, op, run_id, usd, now=now)
        total.add_done_callback(
            lambda f: None if f.cancelled() or f.exception() else self.spent(tenant, day, f.result())
        )
        return total

    async def on_run_finished(self, event: RunEvent) -> None:
        """A run's final usage reaches its tenant's day (the last call was never asked about): every tenant's,
        ceiling or not, so a ceiling set later in the day counts the whole day."""
        ev = event.root
        if not isinstance(ev, RunFinished):
            return
        ledger, _ = await self.bus.kv_get(S.KV_BUDGETS, S.kv_key(ev.run_id), BudgetLedger)
        if ledger is None:
            return
        tenant = ledger.tenant or S.DEFAULT_TENANT  # a run without a tenant is the default tenant's
        cost = round(ev.detail.usage.cost_usd - ledger.delegated_usd, 8)  # sub-agents account their own
        await self.account(tenant, "settle", ev.run_id, cost, now=False)  # within SETTLE_EVERY_S
        if cost > ledger.tenant_accounted_usd:
            self.tenant_spend.add(cost - ledger.tenant_accounted_usd, {"tenant": tenant})

    # --- the budget decision -----------------------------------------------------------------------
    async def on_reserve(self, req: BudgetRequest) -> BudgetDecision:
        s = self.settings
        if req.tenant is None:  # a run without a tenant belongs to the default one: it does not escape its ceiling
            req = req.model_copy(update={"tenant": S.DEFAULT_TENANT})
        ceiling = await self.tenant_ceiling(req.tenant)
        own = round(req.spent.cost_usd - req.delegated_usd, 8)  # sub-agents account their own spend
        # every tenant's day is kept (one write per tenant at a time per replica); the decision waits for it only
        # where a ceiling reads it
        day = self.account(req.tenant or S.DEFAULT_TENANT, "spend", req.run_id, own, now=ceiling is not None)
        tenant_spent = await day if ceiling is not None else None
        key = S.kv_key(req.run_id)
        known: tuple[BudgetLedger | None, int] | None = self._ledgers.pop(key, None)
        if known is None and first_ask(req):  # no ledger yet, most likely: created without a read first
            known = (None, 0)
        await self.ratio(req.model)  # loads the shared ratios once
        samples: list[tuple[str, float]] = []

        def decide(ledger: BudgetLedger | None) -> tuple[BudgetLedger, BudgetDecision] | Unchanged[BudgetDecision]:
            ledger = ledger or BudgetLedger(run_id=req.run_id, tenant=req.tenant)
            if str(req.turn) in ledger.decisions:  # asked again (a redelivery): the same answer
                return Unchanged(ledger.decisions[str(req.turn)])
            samples[:] = observe(ledger, req)
            calibration = self.learned(req.model, samples)
            ledger.tenant_accounted_usd = own
            ledger.delegated_usd = req.delegated_usd
            rule = Rule(
                warn_at=s.warn_at,
                compact_at=s.compact_at,
                fallback_model=s.fallback_model,
                exhausted_policy=s.budget_exhausted_policy,
                compact_at_cached=s.compact_at_cached,
                wrap_up_reserve_usd=s.wrap_up_reserve_usd,
                wrap_up_output_tokens=s.wrap_up_output_tokens,
                calibration=calibration,
            )
            decision = evaluate(req, ledger, **rule, tenant_spent_usd=tenant_spent, tenant_ceiling_usd=ceiling)
            if ceiling is None:  # a tenant with a ceiling asks every turn: its day is read against it each time
                decision.lease = lease_for(
                    req, ledger, decision, turns=s.budget_lease_turns, seconds=s.budget_lease_s, **rule
                )
            ledger.last_turn = req.turn
            ledger.leased_to = decision.lease.until_turn if decision.lease is not None else 0
            ledger.decisions[str(req.turn)] = decision
            for old in sorted(ledger.decisions, key=int)[:-KEEP_DECISIONS]:  # the ledger does not grow with the run
                del ledger.decisions[old]
            return ledger, decision

        with self.tracer.start_as_current_span(
            "budget reserve", attributes={T.LW_RUN_ID: req.run_id, T.GEN_AI_REQUEST_MODEL: req.model}
        ) as span:
            decision = await self.bus.update(
                S.KV_BUDGETS,
                key,
                BudgetLedger,
                decide,
                known=known,
                saved=lambda v, rev: self.keep(key, v, rev),
            )
            span.set_attribute(T.LW_BUDGET_ACTION, decision.action)
            span.set_attribute("loopwarden.budget.calibration", decision.calibration)
            span.set_attribute("loopwarden.budget.estimated_cost_usd", decision.estimated_cost_usd)
            if decision.lease is not None:
                span.set_attribute("loopwarden.budget.lease_until_turn", decision.lease.until_turn)
        for model, sample in samples:
            self.learn(model, sample)
        self.decisions.add(1, {"action": decision.action})
        if decision.action != "block":
            self.estimated_cost.add(decision.estimated_cost_usd, {"gen_ai.request.model": decision.model})
        for flag in decision.fired:
            kind = THRESHOLD_KINDS.get(flag, "budget.fallback")
            level = kind.removeprefix("budget.")
            await self.bus.publish(
                S.budget_event(level),
                BudgetThreshold(
                    run_id=req.run_id,
                    kind=kind,
                    iteration=req.turn,
                    summary="; ".join(decision.reasons),
                    detail=decision,
                ),
                msg_id=ids.budget_event(req.run_id, req.turn, flag),
            )
        return decision
