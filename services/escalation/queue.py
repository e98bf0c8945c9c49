"""The human queue's rules (pure): raise once, claim exclusively, resolve once."""

from __future__ import annotations

from shared.messages import Escalation, EscalationRaise, EscalationResolution, EscalationResolve


class QueueError(ValueError):
    pass


def raise_item(req: EscalationRaise, traceparent: str | None) -> Escalation:
    return Escalation(**req.model_dump(), traceparent=traceparent)


def claim(item: Escalation, who: str) -> Escalation:
    if item.status == "resolved":
        raise QueueError(f"{item.escalation_id} is already resolved")
    if item.status == "claimed" and item.claimed_by != who:
        raise QueueError(f"{item.escalation_id} is claimed by {item.claimed_by}")
    return item.model_copy(update={"status": "claimed", "claimed_by": who})


def resolve(item: Escalation, req: EscalationResolve) -> tuple[Escalation, EscalationResolution]:
    if item.status == "resolved":
        raise QueueError(f"{item.escalation_id} is already resolved")
    if item.status == "claimed" and item.claimed_by != req.who:
        raise QueueError(f"{item.escalation_id} is claimed by {item.claimed_by}; only they can resolve it")
    if req.action == "accept" and item.kind != "not_judged":
        raise QueueError(
            "'accept' applies to a candidate the judge could not score; use resume, provide_result or abort"
        )
    resolution = EscalationResolution(
        escalation_id=item.escalation_id,
        run_id=item.run_id,
        action=req.action,
        note=req.note,
        result=req.result,
        resolved_by=req.who,
    )
    return item.model_copy(
        update={"status": "resolved", "claimed_by": item.claimed_by or req.who, "resolution": resolution}
    ), resolution
