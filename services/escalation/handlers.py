"""Escalation handlers: the durable human queue in JetStream KV.

Items arrive two ways: an explicit raise command (the planner asks for a human), and by
*subscription* to failure events that always need one (``fatal``, ``unknown_outcome``) —
routing a failure type to humans is a consumer filter, not code elsewhere. People list,
show, claim, renew and resolve through request/reply. Who claims or resolves is the
operator token of the request subject, which the NATS server only lets that operator's
user (or the console's, as ``...console.<operator>``) publish to. A resolution is
published as an event carrying the trace context of the run that raised it.

Listing reads a cache of the bucket kept current by a KV watcher (one record that does not
parse is reported by key, never hides the others); a sweeper returns lapsed leases to the
queue and applies SLA default actions. Every rule is in ``queue.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from opentelemetry import propagate
from pydantic import ValidationError

from services.escalation import ids
from services.escalation import queue as Q
from shared import metrics as M
from shared import subjects as S
from shared import telemetry as T
from shared.bus import Bus, CasConflict, Unchanged
from shared.contracts.catalogue import ContractCatalogue
from shared.contracts.registration import validator_for
from shared.describe import describe
from shared.escalation_actions import carries_result
from shared.failures import HUMAN_FAILURES
from shared.live_config import ConfigUnreadable, LiveConfig
from shared.messages import (
    Escalation,
    EscalationClaim,
    EscalationEvent,
    EscalationQuery,
    EscalationRaise,
    EscalationReply,
    EscalationResolution,
    EscalationResolve,
    EscalationWithdraw,
    OpenItems,
    ToolOutcome,
    utcnow,
)
from shared.payloads import PayloadError
from shared.settings import Settings

log = logging.getLogger("loopwarden.escalation")
R = TypeVar("R")
EVENT_SUBJECT = {
    "claimed": S.ESCALATION_CLAIMED,
    "renewed": S.ESCALATION_RENEWED,
    "expired": S.ESCALATION_EXPIRED,
    "refused": S.ESCALATION_REFUSED,
    "sla_applied": S.ESCALATION_SLA_APPLIED,
}


def current_traceparent() -> str | None:
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get("traceparent")


class EscalationQueue:
    def __init__(self, bus: Bus, telemetry: T.Telemetry, settings: Settings | None = None) -> None:
        self.bus = bus
        self.settings = settings or bus.settings
        meter = telemetry.meter("loopwarden.escalation")
        self.raised = meter.create_counter(M.ESCALATIONS_RAISED, description="escalations by kind")
        self.refused = meter.create_counter(
            M.ESCALATIONS_REFUSED, description="claims and resolutions refused, by verb"
        )
        self.sla_breaches = meter.create_counter(
            M.SLA_BREACHES, description="items nobody resolved within their SLA: its default action applied"
        )
        # the queue as this replica's cache holds it, computed at collection (no I/O)
        M.computed_gauge(
            meter,
            M.QUEUE_ITEMS,
            lambda: [({"kind": k, "status": st}, n) for (k, st), n in self.figures().items.items()],
            description="unresolved items by kind and status (open, claimed)",
        )
        M.computed_gauge(
            meter,
            M.QUEUE_OLDEST_AGE,
            lambda: [({"kind": k}, age) for k, age in self.figures().oldest_age_s.items()],
            unit="s",
            description="age of the oldest unresolved item, by kind (0: none)",
        )
        M.computed_gauge(
            meter,
            M.QUEUE_PAST_SLA,
            lambda: [({"kind": k}, n) for k, n in self.figures().past_sla.items()],
            description="unresolved items past their SLA deadline, by kind (the sweeper applies their default action)",
        )
        self.slas = Q.sla_rules(json.loads(self.settings.escalation_slas) if self.settings.escalation_slas else None)
        # the roster: the applied access file's (lw_config), else LW_OPERATORS; read again before each action
        self.live = LiveConfig(bus)
        for kind, rule in self.slas.items():  # at 0 from the start: the first breach is an increase
            self.sla_breaches.add(0, {"kind": kind, "action": rule.action})
        self.roster: dict[str, list[str]] | None = (
            json.loads(self.settings.operators) if self.settings.operators else None
        )
        self.items: dict[str, Escalation] = {}
        self.catalogue = ContractCatalogue(bus)  # the tools' output contracts, for a hand-made result
        self.unreadable: dict[str, str] = {}
        self.counted: dict[str, int] | None = None  # each tenant's open items as last written
        self._tasks: list[asyncio.Task[None]] = []
        self._figures: tuple[float, Q.Figures] | None = None
        bus.on_stop.append(self.stop)

    def figures(self) -> Q.Figures:
        """The queue's figures, computed at most once a second (a collection asks for three gauges)."""
        now = time.monotonic()
        if self._figures is None or now - self._figures[0] >= 1.0:
            self._figures = (now, Q.figures(list(self.items.values()), utcnow()))
        return self._figures[1]

    def register(self) -> None:
        b = self.bus
        b.consumer(durable=S.DURABLE_ESCALATION_RAISE, filter_subjects=[S.ESCALATION_RAISE], model=EscalationRaise)(
            self.on_raise
        )
        b.consumer(
            durable=S.DURABLE_ESCALATION_FAILURES,
            stream=S.STREAM_EVT,
            model=ToolOutcome,
            filter_subjects=[f"{S.FAILURE_PREFIX}.{t}.>" for t in HUMAN_FAILURES],
        )(self.on_failure)
        b.consumer(
            durable=S.DURABLE_ESCALATION_WITHDRAW, filter_subjects=[S.ESCALATION_WITHDRAW], model=EscalationWithdraw
        )(self.on_withdraw)
        error = lambda reason: EscalationReply(ok=False, error=reason)  # noqa: E731
        b.responder(subject=S.ESCALATION_LIST, model=EscalationQuery, reply=error)(self.on_list)
        b.responder(subject=S.ESCALATION_SHOW, model=EscalationQuery, reply=error)(self.on_show)
        for subject in (S.ESCALATION_CLAIM, f"{S.ESCALATION_CLAIM}.>"):
            b.subject_responder(subject=subject, model=EscalationClaim, reply=error)(self.on_claim)
        renew = f"{S.ESCALATION_RPC_PREFIX}.renew"
        for subject in (renew, f"{renew}.>"):
            b.subject_responder(subject=subject, model=EscalationClaim, reply=error)(self.on_renew)
        for subject in (S.ESCALATION_RESOLVE, f"{S.ESCALATION_RESOLVE}.>"):
            b.subject_responder(subject=subject, model=EscalationResolve, reply=error)(self.on_resolve)

    # --- the watched cache and the sweeper ----------------------------------------------------------
    async def start(self) -> None:
        """Load the bucket into the cache (before any request is served), then keep it current."""
        kv = await self.bus.kv(S.KV_ESCALATIONS)
        watcher = await kv.watchall()
        while True:
            entry = await watcher.updates(timeout=30)  # type: ignore[no-untyped-call]
            if entry is None:  # the initial values are in
                break
            await self._apply_entry(entry)
        self._tasks.append(asyncio.create_task(self._watch(watcher)))
        self._tasks.append(asyncio.create_task(self._sweep()))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _watch(self, watcher: Any) -> None:
        try:
            async for entry in watcher:
                if entry is not None:
                    await self._apply_entry(entry)
        finally:
            with contextlib.suppress(Exception):
                await watcher.stop()

    async def _apply_entry(self, entry: Any) -> None:
        key = entry.key
        if entry.operation in ("DEL", "PURGE") or entry.value is None:
            self.items.pop(key, None)
            self.unreadable.pop(key, None)
            return
        try:  # a large item is stored by reference (claim-check): follow it, as Bus.kv_get does
            value = await self.bus.payloads.inflate_value(
                self.bus.broker.connection, entry.value, max_bytes=self.settings.value_limit(S.KV_ESCALATIONS)
            )
            self.items[key] = Escalation.model_validate_json(value)
            self.unreadable.pop(key, None)
        except (ValidationError, PayloadError) as err:
            self.items.pop(key, None)
            self.unreadable[key] = describe(err) if isinstance(err, ValidationError) else str(err)
            log.error("lw_escalations/%s does not parse (skipped, the rest are listed): %s", key, self.unreadable[key])

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self.settings.escalation_sweep_s)
            try:
                await self.sweep(utcnow())
            except Exception:  # a bad moment (reconnect) must not end the sweeper
                log.exception("escalation sweep failed")

    async def sweep(self, now: datetime) -> None:
        for item in Q.due(list(self.items.values()), now):
            await self._expire_or_sla(item.escalation_id, now)
        await self.count_open()

    async def count_open(self) -> None:
        """Each tenant's open items, where the planners read them (``lw_human_counts``, key ``open``): their
        ``max_human_items`` quota and the fleet's view. An item says its run's tenant (its raiser carried it);
        one filed without (by an older raiser) counts as the default tenant's. Written when the counts change
        (every replica keeps the same index, so they write the same counts)."""
        counts = Q.open_by_tenant(list(self.items.values()))
        if counts != self.counted:
            await self.bus.kv_put(S.KV_HUMAN_COUNTS, "open", OpenItems(counts=counts))
            self.counted = counts

    async def _expire_or_sla(self, escalation_id: str, now: datetime) -> None:
        Swept = tuple[EscalationEvent, EscalationResolution | None] | None

        def step(item: Escalation | None) -> tuple[Escalation, Swept] | Unchanged[Swept]:
            if item is None:
                return Unchanged(None)
            sla = Q.apply_sla(item, now)
            if sla is not None:
                new, resolution = sla
                return new, (new.trail[-1], resolution)
            expired = Q.expire(item, now)
            if expired is not None:
                return expired[0], (expired[1], None)
            return Unchanged(None)

        try:
            outcome = await self.bus.update(S.KV_ESCALATIONS, escalation_id, Escalation, step)
        except CasConflict:
            return  # another replica is on it
        if outcome is None:
            return
        event, resolution = outcome
        await self._event(event)
        if resolution is not None:
            item = self.items.get(escalation_id)
            if item is not None and item.sla_action is not None:
                self.sla_breaches.add(1, {"kind": item.kind, "action": item.sla_action})
            log.warning("escalation %s: SLA applied %s", escalation_id, resolution.action)
            await self._publish_resolution(escalation_id, resolution)

    # --- raising -------------------------------------------------------------------------------------
    async def on_failure(self, outcome: ToolOutcome) -> None:
        await self.on_raise(Q.failure_raise(outcome))

    async def on_raise(self, req: EscalationRaise) -> None:
        existing, _ = await self.bus.kv_get(S.KV_ESCALATIONS, req.escalation_id, Escalation)
        if existing is not None:  # already queued: publish the same event again (deduplicated)
            await self.bus.publish(S.ESCALATION_RAISED, existing, msg_id=ids.raised(req.escalation_id))
            return
        # what the item says of its run (its tenant) is what the raise carried: never the run's record
        item = Q.raise_item(req, current_traceparent(), sla=self.slas.get(req.kind))
        item, _, created = await self.bus.create_or_get(S.KV_ESCALATIONS, req.escalation_id, item)
        if created:
            self.raised.add(1, {"kind": req.kind})
            log.warning("escalation %s (%s) for run %s: %s", req.escalation_id, req.kind, req.run_id, req.reason)
        self.items[item.escalation_id] = item
        await self.bus.publish(S.ESCALATION_RAISED, item, msg_id=ids.raised(req.escalation_id))

    async def on_withdraw(self, req: EscalationWithdraw) -> None:
        """The raiser no longer needs a human: the item closes as resolved by the system (idempotent: an item
        resolved already, by a person or by an earlier delivery of this command, stays as it is)."""
        now = utcnow()

        def step(item: Escalation | None) -> tuple[Escalation, Escalation | None] | Unchanged[Escalation | None]:
            closed = Q.withdraw(item, req, now=now)
            return Unchanged(item) if closed is None else (closed[0], closed[0])

        item = await self.bus.update(S.KV_ESCALATIONS, req.escalation_id, Escalation, step)
        if item is None or item.resolution is None:
            return
        self.items[item.escalation_id] = item
        if item.resolution.resolved_by == Q.SYSTEM_OPERATOR:  # closed now, or on an earlier delivery: said again
            log.warning("escalation %s withdrawn: %s", req.escalation_id, req.reason)
            await self._publish_resolution(req.escalation_id, item.resolution, item.traceparent)

    # --- reading -------------------------------------------------------------------------------------
    async def on_list(self, query: EscalationQuery) -> EscalationReply:
        items = Q.select(list(self.items.values()), query, utcnow())
        return EscalationReply(ok=True, escalations=items, unreadable=sorted(self.unreadable))

    async def on_show(self, query: EscalationQuery) -> EscalationReply:
        if not query.escalation_id:
            return EscalationReply(ok=False, error="show needs escalation_id")
        item = self.items.get(query.escalation_id)
        if item is None:
            try:
                item, _ = await self.bus.kv_get(S.KV_ESCALATIONS, query.escalation_id, Escalation)
            except ValidationError as err:
                return EscalationReply(ok=False, error=f"{query.escalation_id} does not parse: {describe(err)}")
        if item is None:
            return EscalationReply(ok=False, error=f"no escalation {query.escalation_id}")
        return EscalationReply(ok=True, escalations=[item])

    # --- acting --------------------------------------------------------------------------------------
    async def on_claim(self, req: EscalationClaim, subject: str) -> EscalationReply:
        return await self._act("claim", req.escalation_id, subject, self._claim_step)

    async def on_renew(self, req: EscalationClaim, subject: str) -> EscalationReply:
        return await self._act("renew", req.escalation_id, subject, self._renew_step)

    def _claim_step(self, item: Escalation, actor: Q.Actor, now: datetime) -> tuple[Escalation, Any]:
        Q.authorize(actor, item, self.roster)
        claimed = Q.claim(item, actor, now=now, lease_s=self.settings.escalation_lease_s)
        return claimed, None

    def _renew_step(self, item: Escalation, actor: Q.Actor, now: datetime) -> tuple[Escalation, Any]:
        Q.authorize(actor, item, self.roster)
        return Q.renew(item, actor, now=now, lease_s=self.settings.escalation_lease_s), None

    async def on_resolve(self, req: EscalationResolve, subject: str) -> EscalationReply:
        result_errors = await self._result_errors(req)

        def step(item: Escalation, actor: Q.Actor, now: datetime) -> tuple[Escalation, Any]:
            Q.authorize(actor, item, self.roster)
            errors = result_errors.get(item.tool or "") if carries_result(req.action) else None
            return Q.resolve(item, req, actor, now=now, result_errors=errors)

        return await self._act("resolve", req.escalation_id, subject, step)

    async def _result_errors(self, req: EscalationResolve) -> dict[str, list[str]]:
        """For an action that carries the tool's result: its output contract errors of ``req.result`` (by tool)."""
        if not carries_result(req.action):
            return {}
        item = self.items.get(req.escalation_id)
        if item is None:
            item, _ = await self.bus.kv_get(S.KV_ESCALATIONS, req.escalation_id, Escalation)
        if item is None or not item.tool:
            return {}
        contract = await self.catalogue.get(item.tool)
        if contract is None:
            return {item.tool: [f"no output contract is registered for '{item.tool}'"]}
        errors = validator_for(contract, "output").errors(req.result)
        return {item.tool: [f"{e.path}: {e.message}" for e in errors]} if errors else {}

    async def _act(
        self,
        verb: str,
        escalation_id: str,
        subject: str,
        step: Callable[[Escalation, Q.Actor, datetime], tuple[Escalation, Any]],
    ) -> EscalationReply:
        actor: Q.Actor | None = None
        try:
            self.roster = await self.live.roster()  # as applied now (LW_CONFIG_REFRESH_S at most old)
        except ConfigUnreadable as err:  # never decided on a guess: no roster would let anyone act
            return EscalationReply(ok=False, error=f"the operators' roster cannot be read right now: {err}")
        try:
            actor = Q.actor_from_subject(subject, S.ESCALATION_RPC_PREFIX, verb)
            who = actor
            now = utcnow()

            def apply(item: Escalation | None) -> tuple[Escalation, tuple[Escalation, Any]]:
                if item is None:
                    raise Q.QueueError(f"no escalation {escalation_id}")
                new, extra = step(item, who, now)
                return new, (new, extra)

            new, extra = await self.bus.update(S.KV_ESCALATIONS, escalation_id, Escalation, apply)
        except (Q.Refused, Q.Conflict) as err:  # both leave a trace: the item's trail, evt.escalation.refused
            await self._refuse(verb, escalation_id, actor, str(err))
            return EscalationReply(ok=False, error=f"refused: {err}" if isinstance(err, Q.Refused) else str(err))
        except Q.QueueError as err:
            return EscalationReply(ok=False, error=str(err))
        self.items[new.escalation_id] = new
        await self._event(new.trail[-1])
        if isinstance(extra, EscalationResolution):
            await self._publish_resolution(escalation_id, extra, new.traceparent)
        return EscalationReply(ok=True, escalations=[new])

    async def _refuse(self, verb: str, escalation_id: str, actor: Q.Actor | None, reason: str) -> None:
        self.refused.add(1, {"verb": verb})
        log.warning("refused %s of %s by %s: %s", verb, escalation_id, actor.label if actor else "?", reason)
        item = self.items.get(escalation_id)
        event = Q.refusal(item, escalation_id, actor, verb, reason)
        await self._event(event, msg_id=ids.refused(escalation_id))
        if item is not None:  # the item's own trail shows the attempt too

            def record(current: Escalation | None) -> tuple[Escalation, None] | Unchanged[None]:
                if current is None:
                    return Unchanged(None)
                return current.model_copy(update={"trail": [*current.trail, event][-Q.MAX_TRAIL :]}), None

            with contextlib.suppress(CasConflict):
                await self.bus.update(S.KV_ESCALATIONS, escalation_id, Escalation, record)

    async def _event(self, event: EscalationEvent, msg_id: str | None = None) -> None:
        if event.kind == "resolved":
            return  # the resolution itself is the event (lw.v1.evt.escalation.resolved)
        subject = EVENT_SUBJECT[event.kind]
        who = event.operator or "-"
        await self.bus.publish(
            subject, event, msg_id=msg_id or f"{event.kind}.{event.escalation_id}.{who}.{event.at.isoformat()}"
        )

    async def _publish_resolution(
        self, escalation_id: str, resolution: EscalationResolution, traceparent: str | None = None
    ) -> None:
        if traceparent is None:
            item = self.items.get(escalation_id)
            traceparent = item.traceparent if item else None
        await self.bus.publish(
            S.ESCALATION_RESOLVED, resolution, msg_id=ids.resolved(escalation_id), traceparent=traceparent
        )
