"""The human queue's rules (pure): raise once, claim exclusively under a lease, resolve once.

Who acts is an ``Actor`` the handlers derived from the request subject the NATS server let
through (``lw.v1.rpc.escalation.<verb>.<operator>`` or ``...<verb>.console.<operator>``);
nothing here reads an identity from a payload. Time is passed in, so every rule — lease
expiry, SLA deadlines, filters by age — is a plain function of its arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, assert_never

from shared import subjects as S
from shared.escalation_actions import ACTIONS, KINDS, SlaRule, allowed_actions, missing
from shared.failures import human_kind
from shared.messages import (
    Escalation,
    EscalationAction,
    EscalationDetails,
    EscalationEvent,
    EscalationEventKind,
    EscalationKind,
    EscalationQuery,
    EscalationRaise,
    EscalationResolution,
    EscalationResolve,
    EscalationWithdraw,
    SlaAction,
    ToolOutcome,
    escalation_id_for_call,
    utcnow,
)

__all__ = ["SlaRule", "allowed_actions"]  # the table's, re-exported where the service's rules are read

CONSOLE = "console"
MAX_TRAIL = 50


class QueueError(ValueError):
    pass


class Refused(QueueError):
    """The operator may not do this (recorded as a ``refused`` event)."""


class Conflict(QueueError):
    """The queue's state says no: someone else holds the item, it is resolved already, or the caller's
    lease lapsed. Recorded as a ``refused`` event too, so a late or conflicting act leaves a trace."""


@dataclass(frozen=True)
class Actor:
    """An identity the server enforced: the operator, and the service acting for them (if any)."""

    operator: str
    via: str | None = None

    @property
    def label(self) -> str:
        return f"{self.operator} (via {self.via})" if self.via else self.operator


# --- identity -------------------------------------------------------------------------------------


def actor_from_subject(subject: str, prefix: str, verb: str) -> Actor:
    """``<prefix>.<verb>.<operator>`` or ``<prefix>.<verb>.console.<operator>``; anything else is refused."""
    head = f"{prefix}.{verb}"
    tokens = subject[len(head) + 1 :].split(".") if subject.startswith(head + ".") else []
    if len(tokens) == 1 and tokens[0] and tokens[0] != CONSOLE:
        return Actor(tokens[0])
    if len(tokens) == 2 and tokens[0] == CONSOLE and tokens[1] and tokens[1] != CONSOLE:
        return Actor(tokens[1], via=CONSOLE)
    raise Refused(
        f"no verified identity on {subject!r}: send to {head}.<operator> with that operator's credentials "
        "(a name written in the payload is not an identity)"
    )


def authorize(actor: Actor, item: Escalation, roster: dict[str, list[str]] | None) -> None:
    """The roster maps operator -> kinds they may act on ('*' = all); no roster = every operator, every kind."""
    if roster is None:
        return
    kinds = roster.get(actor.operator)
    if kinds is None:
        raise Refused(f"{actor.operator} is not an operator of this queue")
    if "*" not in kinds and item.kind not in kinds:
        allowed = ", ".join(kinds) or "none"
        raise Refused(f"{actor.operator} may not act on {item.kind} escalations (allowed: {allowed})")


# --- raising --------------------------------------------------------------------------------------


def raise_item(
    req: EscalationRaise,
    traceparent: str | None,
    *,
    now: datetime | None = None,
    sla: SlaRule | None = None,
) -> Escalation:
    """The queue item ``req`` files: what it says of its run (the tenant) is what the raiser carried. It keeps no
    copy of the run's turns: a reader shows them from the run's conversation (``Client.show``)."""
    now = now or utcnow()
    return Escalation(
        **req.model_dump(),
        traceparent=traceparent,
        created_at=now,
        sla_deadline=now + timedelta(seconds=sla.after_s) if sla else None,
        sla_action=sla.action if sla else None,
        allowed_actions=allowed_actions(req.kind),
    )


def failure_raise(outcome: ToolOutcome) -> EscalationRaise:
    """The item a failure that always needs a human (``HUMAN_FAILURES``) files, from its failure event."""
    return EscalationRaise(
        escalation_id=escalation_id_for_call(outcome.run_id, outcome.iteration, outcome.call_id),
        run_id=outcome.run_id,
        kind=human_kind(outcome.failure_type),
        reason=outcome.error or "tool failure",
        tool=outcome.tool,
        call_id=outcome.call_id,
        details=EscalationDetails(
            arguments=outcome.arguments,
            attempts=outcome.attempts,
            error=outcome.error,
            failure_type=outcome.failure_type,
        ),
        tenant=outcome.tenant,  # the call's tenant, as the planner put it on the call (None from an older one)
    )


def _event(
    item: Escalation, kind: EscalationEventKind, actor: Actor | None, now: datetime, **fields: Any
) -> EscalationEvent:
    return EscalationEvent(
        escalation_id=item.escalation_id,
        run_id=item.run_id,
        kind=kind,
        operator=actor.operator if actor else None,
        via=actor.via if actor else None,
        at=now,
        **fields,
    )


def _with_trail(item: Escalation, event: EscalationEvent, **update: Any) -> Escalation:
    return item.model_copy(update={**update, "trail": [*item.trail, event][-MAX_TRAIL:]})


def refusal(
    item: Escalation | None, escalation_id: str, actor: Actor | None, action: str, reason: str
) -> EscalationEvent:
    return EscalationEvent(
        escalation_id=escalation_id,
        run_id=item.run_id if item else "",
        kind="refused",
        operator=actor.operator if actor else None,
        via=actor.via if actor else None,
        action=action,
        reason=reason,
    )


# --- claims and leases ----------------------------------------------------------------------------


def _lease_live(item: Escalation, now: datetime) -> bool:
    return item.status == "claimed" and (item.lease_expires_at is None or item.lease_expires_at > now)


def claim(
    item: Escalation, who: str | Actor, *, now: datetime | None = None, lease_s: float | None = None
) -> Escalation:
    """Take the item (or take it again, as its holder). A lapsed lease of someone else is free to take."""
    actor = who if isinstance(who, Actor) else Actor(who)
    now = now or utcnow()
    if item.status == "resolved":
        raise Conflict(f"{item.escalation_id} is already resolved")
    if _lease_live(item, now) and item.claimed_by != actor.operator:
        raise Conflict(f"{item.escalation_id} is claimed by {item.claimed_by}")
    expires = now + timedelta(seconds=lease_s) if lease_s else None
    event = _event(item, "claimed", actor, now, lease_expires_at=expires)
    return _with_trail(
        item,
        event,
        status="claimed",
        claimed_by=actor.operator,
        claimed_via=actor.via,
        lease_expires_at=expires,
    )


def renew(item: Escalation, actor: Actor, *, now: datetime, lease_s: float) -> Escalation:
    """Extend the holder's lease; only the holder, only while the lease is live."""
    if item.status == "resolved":
        raise Conflict(f"{item.escalation_id} is already resolved")
    if item.status != "claimed" or item.claimed_by != actor.operator:
        raise Conflict(f"{item.escalation_id} is not claimed by {actor.operator}; claim it first")
    if not _lease_live(item, now):
        raise Conflict(f"{item.escalation_id}: the lease of {actor.operator} has expired; claim it again")
    expires = now + timedelta(seconds=lease_s)
    return _with_trail(item, _event(item, "renewed", actor, now, lease_expires_at=expires), lease_expires_at=expires)


def expire(item: Escalation, now: datetime) -> tuple[Escalation, EscalationEvent] | None:
    """A claim whose lease lapsed returns the item to the queue (None: nothing to do)."""
    if item.status != "claimed" or item.lease_expires_at is None or item.lease_expires_at > now:
        return None
    event = _event(
        item,
        "expired",
        Actor(item.claimed_by or "?", item.claimed_via),
        now,
        reason=f"lease of {item.claimed_by} expired at {item.lease_expires_at.isoformat()}",
    )
    return _with_trail(item, event, status="open", claimed_by=None, claimed_via=None, lease_expires_at=None), event


# --- resolving ------------------------------------------------------------------------------------


def resolve(
    item: Escalation,
    req: EscalationResolve,
    who: Actor | None = None,
    *,
    now: datetime | None = None,
    result_errors: list[str] | None = None,
) -> tuple[Escalation, EscalationResolution]:
    actor = who or Actor(req.who or "")
    now = now or utcnow()
    if not actor.operator:
        raise Refused("a resolution needs a verified operator")
    if item.status == "resolved":
        raise Conflict(f"{item.escalation_id} is already resolved")
    if _lease_live(item, now) and item.claimed_by != actor.operator:
        raise Conflict(f"{item.escalation_id} is claimed by {item.claimed_by}; only they can resolve it")
    allowed = allowed_actions(item.kind)
    if req.action not in allowed:
        only = ACTIONS[req.action].only
        why = only or f"'{req.action}' does not apply to a {item.kind} escalation"
        raise QueueError(f"{why}; {'for ' + item.kind + ' ' if only else ''}use one of {', '.join(allowed)}")
    lacking = missing(req.action, req.note, req.result)
    if lacking:
        raise QueueError(lacking)
    if result_errors:
        raise QueueError(f"the result breaks the output contract of '{item.tool}': " + "; ".join(result_errors))
    resolution = EscalationResolution(
        escalation_id=item.escalation_id,
        run_id=item.run_id,
        action=req.action,
        note=req.note,
        result=req.result,
        resolved_by=actor.operator,
        via=actor.via,
        resolved_at=now,
    )
    return _resolved(item, resolution, _event(item, "resolved", actor, now, action=req.action)), resolution


def _resolved(item: Escalation, resolution: EscalationResolution, event: EscalationEvent) -> Escalation:
    return _with_trail(
        item,
        event,
        status="resolved",
        claimed_by=item.claimed_by or resolution.resolved_by,
        lease_expires_at=None,
        resolution=resolution,
    )


# --- withdrawing --------------------------------------------------------------------------------

SYSTEM_OPERATOR = "loopwarden"  # who closes an item its raiser withdrew (no person decided)


def withdraw(
    item: Escalation | None, req: EscalationWithdraw, *, now: datetime | None = None
) -> tuple[Escalation, EscalationResolution] | None:
    """Close an item nobody needs to decide any more, as resolved by the system with the reason in its note
    and its trail (the existing resolved state: every reader already shows it). An item not queued yet is
    filed closed, so its failure event arriving later finds it and raises nothing. None: nothing changes,
    because the item is resolved already (a person's resolution, or an earlier withdrawal, stands)."""
    now = now or utcnow()
    if item is None:
        if req.unknown is not None:
            filed = failure_raise(req.unknown).model_copy(update={"escalation_id": req.escalation_id})
        elif req.raised is not None and req.raised.escalation_id == req.escalation_id:
            filed = req.raised
        else:
            return None  # nothing to file it from: an item raised later is the raiser's to withdraw again
        item = raise_item(filed, None, now=now)
    if item.status == "resolved":
        return None
    resolution = EscalationResolution(
        escalation_id=item.escalation_id,
        run_id=item.run_id,
        action="resume",  # the run went on (with the known result); the planner no longer waits on the item
        note=req.reason,
        resolved_by=SYSTEM_OPERATOR,
        resolved_at=now,
    )
    event = _event(item, "resolved", Actor(SYSTEM_OPERATOR), now, action="resume", reason=req.reason)
    return _resolved(item, resolution, event), resolution


# --- SLAs -----------------------------------------------------------------------------------------

SLA_OPERATOR = "sla"
DEFAULT_SLAS: dict[EscalationKind, SlaRule] = {kind: spec.sla for kind, spec in KINDS.items()}


def sla_rules(overrides: dict[str, dict[str, Any]] | None) -> dict[EscalationKind, SlaRule]:
    """The defaults, with ``LW_ESCALATION_SLAS`` (already validated by the settings) over them."""
    rules = dict(DEFAULT_SLAS)
    for kind, rule in (overrides or {}).items():
        base = rules[kind]  # type: ignore[index]
        rules[kind] = SlaRule(float(rule.get("after_s", base.after_s)), rule.get("action", base.action))  # type: ignore[index]
    return rules


def sla_resolution_action(item: Escalation, action: SlaAction) -> tuple[EscalationAction, str]:
    """The resolution an SLA's default action means for this kind, and the note the run gets."""
    waited = "no human decided within the SLA"
    match action:
        case "abort":
            return "abort", f"{waited}: aborted"
        case "deny":
            if "reject" in allowed_actions(item.kind):
                return "reject", f"{waited}: denied"
            return "abort", f"{waited}: denied"
        case "accept_if_judged":
            score, threshold = item.details.get("score"), item.details.get("threshold")
            judged = isinstance(score, int | float) and isinstance(threshold, int | float) and score >= threshold
            if judged and "approve" in allowed_actions(item.kind):
                return "approve", f"{waited}: accepted on the judge's passing score"
            if "reject" in allowed_actions(item.kind):
                return "reject", f"{waited}: not accepted without a passing judge score; revise the answer"
            return "abort", f"{waited}: nothing judged to accept"
        case "fall_back":
            if "resume" in allowed_actions(item.kind):
                return "resume", f"{waited}: continue without this result and say what is missing"
            if "reject" in allowed_actions(item.kind):
                return "reject", f"{waited}: fell back to no"
            return "abort", f"{waited}: no fallback"
        case _:
            assert_never(action)


def apply_sla(item: Escalation, now: datetime) -> tuple[Escalation, EscalationResolution] | None:
    """Past its deadline, an unresolved item is resolved by its SLA's default action (None: not due)."""
    if item.status == "resolved" or item.sla_deadline is None or item.sla_action is None or item.sla_deadline > now:
        return None
    action, note = sla_resolution_action(item, item.sla_action)
    resolution = EscalationResolution(
        escalation_id=item.escalation_id,
        run_id=item.run_id,
        action=action,
        note=note,
        resolved_by=SLA_OPERATOR,
        resolved_at=now,
        by_sla=True,
    )
    event = _event(item, "sla_applied", None, now, action=action, reason=f"SLA {item.sla_action}: {note}")
    return _resolved(item, resolution, event), resolution


# --- listing --------------------------------------------------------------------------------------


def matches(item: Escalation, query: EscalationQuery, now: datetime) -> bool:
    age = (now - item.created_at).total_seconds()
    return (
        query.status in ("all", item.status)
        and query.run_id in (None, item.run_id)
        and query.kind in (None, item.kind)
        and query.tool in (None, item.tool)
        and (query.older_than_s is None or age >= query.older_than_s)
        and (query.newer_than_s is None or age <= query.newer_than_s)
    )


def select(items: list[Escalation], query: EscalationQuery, now: datetime) -> list[Escalation]:
    return sorted((i for i in items if matches(i, query, now)), key=lambda e: e.created_at)


def due(items: list[Escalation], now: datetime) -> list[Escalation]:
    """Items whose lease lapsed or whose SLA deadline passed (the sweeper acts on these)."""
    return [
        i
        for i in items
        if i.status != "resolved"
        and (
            (i.status == "claimed" and i.lease_expires_at is not None and i.lease_expires_at <= now)
            or (i.sla_deadline is not None and i.sla_deadline <= now)
        )
    ]


def open_by_tenant(items: list[Escalation]) -> dict[str, int]:
    """Each tenant's open items (open or claimed, not resolved), by the tenant each item names (its raiser's
    word; an item that names none is the default tenant's)."""
    counts: dict[str, int] = {}
    for item in items:
        if item.status != "resolved":
            tenant = item.tenant or S.DEFAULT_TENANT
            counts[tenant] = counts.get(tenant, 0) + 1
    return counts


# --- the queue's figures (loopwarden.queue.*: docs/observability.md) -------------------------------------


@dataclass(frozen=True)
class Figures:
    """Unresolved items per (kind, status), the age of the oldest unresolved item per kind (s), and how many
    are past their SLA deadline per kind; every kind is named, with zeros where it has nothing."""

    items: dict[tuple[str, str], int]
    oldest_age_s: dict[str, float]
    past_sla: dict[str, int]


def figures(items: list[Escalation], now: datetime) -> Figures:
    counts: dict[tuple[str, str], int] = {(kind, status): 0 for kind in KINDS for status in ("open", "claimed")}
    oldest: dict[str, float] = dict.fromkeys(KINDS, 0.0)
    past: dict[str, int] = dict.fromkeys(KINDS, 0)
    for item in items:
        if item.status == "resolved":
            continue
        counts[(item.kind, item.status)] = counts.get((item.kind, item.status), 0) + 1
        oldest[item.kind] = max(oldest.get(item.kind, 0.0), (now - item.created_at).total_seconds())
        if item.sla_deadline is not None and item.sla_deadline <= now:
            past[item.kind] = past.get(item.kind, 0) + 1
    return Figures(counts, oldest, past)
