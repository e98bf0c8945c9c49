"""Escalation handlers: the durable human queue in JetStream KV.

Items arrive two ways: an explicit raise command (the planner asks for a human), and by
*subscription* to failure events that always need one (``fatal``, ``unknown_outcome``) —
routing a failure type to humans is a consumer filter, not code elsewhere. People list,
claim and resolve through request/reply; a resolution is published as an event carrying
the trace context of the run that raised it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from faststream.nats import NatsRouter
from nats.js.errors import NoKeysError
from opentelemetry import propagate

from services.escalation import queue as Q
from shared import subjects as S
from shared import telemetry as T
from shared.bus import Bus, CasConflict
from shared.messages import (
    Escalation,
    EscalationClaim,
    EscalationQuery,
    EscalationRaise,
    EscalationReply,
    EscalationResolution,
    EscalationResolve,
    RunEvent,
    ToolOutcome,
    escalation_id_for_call,
)

log = logging.getLogger("loopwarden.escalation")
R = TypeVar("R")
HUMAN_FAILURES = ("fatal", "unknown_outcome")


def current_traceparent() -> str | None:
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get("traceparent")


class EscalationQueue:
    def __init__(self, bus: Bus, telemetry: T.Telemetry) -> None:
        self.bus = bus
        self.raised = telemetry.meter("loopwarden.escalation").create_counter(
            "loopwarden.escalations.raised", description="escalations by kind"
        )

    def register(self, router: NatsRouter) -> None:
        b = self.bus
        b.consumer(router, durable="escalation_raise", filter_subjects=[S.ESCALATION_RAISE], model=EscalationRaise)(
            self.on_raise
        )
        b.consumer(
            router,
            durable="escalation_failures",
            stream=S.STREAM_EVT,
            model=ToolOutcome,
            filter_subjects=[f"{S.FAILURE_PREFIX}.{t}.>" for t in HUMAN_FAILURES],
        )(self.on_failure)
        error = lambda reason: EscalationReply(ok=False, error=reason)  # noqa: E731
        b.responder(router, subject=S.ESCALATION_LIST, model=EscalationQuery, reply=error)(self.on_list)
        b.responder(router, subject=S.ESCALATION_CLAIM, model=EscalationClaim, reply=error)(self.on_claim)
        b.responder(router, subject=S.ESCALATION_RESOLVE, model=EscalationResolve, reply=error)(self.on_resolve)

    async def on_failure(self, outcome: ToolOutcome) -> None:
        await self.on_raise(
            EscalationRaise(
                escalation_id=escalation_id_for_call(outcome.run_id, outcome.iteration, outcome.call_id),
                run_id=outcome.run_id,
                kind=outcome.failure_type if outcome.failure_type in HUMAN_FAILURES else "fatal",
                reason=outcome.error or "tool failure",
                tool=outcome.tool,
                call_id=outcome.call_id,
                details={"arguments": outcome.arguments, "attempts": outcome.attempts},
            )
        )

    async def on_raise(self, req: EscalationRaise) -> None:
        item = Q.raise_item(req, current_traceparent())
        try:
            await self.bus.kv_put(S.KV_ESCALATIONS, req.escalation_id, item, revision=0)
        except CasConflict:
            stored, _ = await self.bus.kv_get(S.KV_ESCALATIONS, req.escalation_id, Escalation)
            item = stored or item  # already queued: publish the same event again (deduplicated)
        else:
            self.raised.add(1, {"kind": req.kind})
            log.warning("escalation %s (%s) for run %s: %s", req.escalation_id, req.kind, req.run_id, req.reason)
        await self.bus.publish(S.ESCALATION_RAISED, item, msg_id=f"raised.{req.escalation_id}")

    async def on_list(self, query: EscalationQuery) -> EscalationReply:
        kv = await self.bus.kv(S.KV_ESCALATIONS)
        try:
            keys = await kv.keys()
        except NoKeysError:
            keys = []
        items = []
        for key in keys:
            item, _ = await self.bus.kv_get(S.KV_ESCALATIONS, key, Escalation)
            if item and (query.status in ("all", item.status)) and (query.run_id in (None, item.run_id)):
                items.append(item)
        items.sort(key=lambda e: e.created_at)
        return EscalationReply(ok=True, escalations=items)

    async def on_claim(self, req: EscalationClaim) -> EscalationReply:
        def claim(item: Escalation) -> tuple[Escalation, Escalation]:
            claimed = Q.claim(item, req.who)
            return claimed, claimed

        try:
            claimed = await self.change(req.escalation_id, claim)
        except Q.QueueError as err:
            return EscalationReply(ok=False, error=str(err))
        await self.bus.publish(
            S.ESCALATION_CLAIMED,
            RunEvent(
                run_id=claimed.run_id,
                kind="escalation.claimed",
                summary=req.who,
                detail={"escalation_id": req.escalation_id},
            ),
            msg_id=f"claimed.{req.escalation_id}.{req.who}",
        )
        return EscalationReply(ok=True, escalations=[claimed])

    async def on_resolve(self, req: EscalationResolve) -> EscalationReply:
        def resolve(item: Escalation) -> tuple[Escalation, tuple[Escalation, EscalationResolution]]:
            resolved, resolution = Q.resolve(item, req)
            return resolved, (resolved, resolution)

        try:
            resolved, resolution = await self.change(req.escalation_id, resolve)
        except Q.QueueError as err:
            return EscalationReply(ok=False, error=str(err))
        await self.bus.publish(
            S.ESCALATION_RESOLVED, resolution, msg_id=f"resolved.{req.escalation_id}", traceparent=resolved.traceparent
        )
        return EscalationReply(ok=True, escalations=[resolved])

    async def change(self, escalation_id: str, step: Callable[[Escalation], tuple[Escalation, R]]) -> R:
        """Apply a queue rule to one item under compare-and-swap (a missing item is a QueueError)."""

        def apply(item: Escalation | None) -> tuple[Escalation, R]:
            if item is None:
                raise Q.QueueError(f"no escalation {escalation_id}")
            return step(item)

        return await self.bus.update(S.KV_ESCALATIONS, escalation_id, Escalation, apply)
