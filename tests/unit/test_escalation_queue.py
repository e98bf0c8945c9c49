"""The human queue's rules as plain functions: identity from the subject, who may act, leases,
SLAs and their default actions, what each kind allows, filters. No bus, no clock: time is an argument."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from services.escalation import queue as Q
from shared import subjects as S
from shared.messages import EscalationQuery, EscalationRaise, EscalationResolve

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
P = S.ESCALATION_RPC_PREFIX


def item(kind: str = "fatal", **details: object) -> Q.Escalation:
    raise_ = EscalationRaise(
        escalation_id=f"e-{kind}", run_id="r1", kind=kind, reason="boom", tool="t", details=details
    )  # type: ignore[arg-type]
    return Q.raise_item(raise_, None, now=T0, sla=Q.DEFAULT_SLAS[raise_.kind])


def resolve(action: str, note: str = "", result: object = None) -> EscalationResolve:
    return EscalationResolve(escalation_id="e", action=action, note=note, result=result)  # type: ignore[arg-type]


# --- identity comes from the subject the server let through ---------------------------------------


def test_the_operator_is_the_subject_token() -> None:
    assert Q.actor_from_subject(f"{P}.claim.alice", P, "claim") == Q.Actor("alice")
    assert S.escalation_rpc("resolve", "alice") == f"{P}.resolve.alice"


def test_the_console_acting_for_an_operator_is_recorded_with_both_names() -> None:
    actor = Q.actor_from_subject(S.escalation_rpc("claim", "alice", via="console"), P, "claim")
    assert actor == Q.Actor("alice", via="console") and actor.label == "alice (via console)"


@pytest.mark.parametrize(
    "subject",
    [f"{P}.claim", f"{P}.claim.console", f"{P}.claim.console.console", f"{P}.claim.a.b", f"{P}.resolve.alice"],
)
def test_a_subject_without_a_verified_operator_is_refused(subject: str) -> None:
    with pytest.raises(Q.Refused, match="no verified identity"):
        Q.actor_from_subject(subject, P, "claim")


def test_a_name_in_the_payload_is_not_an_identity() -> None:
    # the old wire field is still accepted on the wire but never decides who acted
    req = EscalationResolve(escalation_id="e", who="finance", action="abort")
    resolved, resolution = Q.resolve(item(), req, Q.Actor("alice"), now=T0)
    assert resolution.resolved_by == "alice" and resolved.resolution is not None


# --- who may act on what -----------------------------------------------------------------------------


def test_the_roster_limits_operators_to_their_kinds() -> None:
    roster = {"alice": ["*"], "bob": ["not_judged"]}
    Q.authorize(Q.Actor("alice"), item("fatal"), roster)
    Q.authorize(Q.Actor("bob"), item("not_judged"), roster)
    with pytest.raises(Q.Refused, match="bob may not act on fatal"):
        Q.authorize(Q.Actor("bob"), item("fatal"), roster)
    with pytest.raises(Q.Refused, match="mallory is not an operator"):
        Q.authorize(Q.Actor("mallory", via="console"), item("fatal"), roster)
    Q.authorize(Q.Actor("anyone"), item("fatal"), None)  # no roster configured: every operator


# --- leases ----------------------------------------------------------------------------------------


def test_a_claim_holds_a_lease_that_renewal_extends_and_expiry_ends() -> None:
    claimed = Q.claim(item(), Q.Actor("alice"), now=T0, lease_s=30)
    assert claimed.lease_expires_at == T0 + timedelta(seconds=30)
    with pytest.raises(Q.QueueError, match="claimed by alice"):
        Q.claim(claimed, Q.Actor("bob"), now=T0 + timedelta(seconds=10), lease_s=30)
    renewed = Q.renew(claimed, Q.Actor("alice"), now=T0 + timedelta(seconds=20), lease_s=30)
    assert renewed.lease_expires_at == T0 + timedelta(seconds=50)
    assert [e.kind for e in renewed.trail] == ["claimed", "renewed"]
    assert Q.expire(renewed, T0 + timedelta(seconds=49)) is None
    expired = Q.expire(renewed, T0 + timedelta(seconds=50))
    assert expired is not None
    back, event = expired
    assert back.status == "open" and back.claimed_by is None and back.lease_expires_at is None
    assert event.kind == "expired" and event.operator == "alice"


def test_only_the_holder_renews_and_only_while_the_lease_is_live() -> None:
    claimed = Q.claim(item(), Q.Actor("alice"), now=T0, lease_s=30)
    with pytest.raises(Q.QueueError, match="not claimed by bob"):
        Q.renew(claimed, Q.Actor("bob"), now=T0, lease_s=30)
    with pytest.raises(Q.QueueError, match="lease of alice has expired"):
        Q.renew(claimed, Q.Actor("alice"), now=T0 + timedelta(seconds=31), lease_s=30)


def test_a_lapsed_lease_is_free_for_another_operator() -> None:
    claimed = Q.claim(item(), Q.Actor("alice"), now=T0, lease_s=30)
    taken = Q.claim(claimed, Q.Actor("bob"), now=T0 + timedelta(seconds=31), lease_s=30)
    assert taken.claimed_by == "bob"
    with pytest.raises(Q.QueueError, match="only they can resolve"):
        Q.resolve(taken, resolve("abort"), Q.Actor("alice"), now=T0 + timedelta(seconds=32))


def test_what_the_queue_state_refuses_is_a_conflict_recorded_like_a_refusal() -> None:
    """Claimed by someone else, already resolved, lease lost: Conflict (the handler records it in the trail
    and on evt.escalation.refused); a request that is malformed for the item's kind stays a plain QueueError."""
    claimed = Q.claim(item("fatal"), Q.Actor("alice"), now=T0, lease_s=30)
    conflicts = [
        lambda: Q.claim(claimed, Q.Actor("bob"), now=T0, lease_s=30),
        lambda: Q.resolve(claimed, resolve("abort"), Q.Actor("bob"), now=T0),
        lambda: Q.renew(claimed, Q.Actor("bob"), now=T0, lease_s=30),
        lambda: Q.renew(claimed, Q.Actor("alice"), now=T0 + timedelta(seconds=31), lease_s=30),
    ]
    done, _ = Q.resolve(claimed, resolve("abort"), Q.Actor("alice"), now=T0)
    conflicts += [
        lambda: Q.claim(done, Q.Actor("bob"), now=T0, lease_s=30),
        lambda: Q.renew(done, Q.Actor("alice"), now=T0, lease_s=30),
        lambda: Q.resolve(done, resolve("abort"), Q.Actor("alice"), now=T0),
    ]
    for attempt in conflicts:
        with pytest.raises(Q.Conflict):
            attempt()
    with pytest.raises(Q.QueueError) as err:
        Q.resolve(claimed, resolve("approve"), Q.Actor("alice"), now=T0)  # not an action for a fatal item
    assert not isinstance(err.value, Q.Conflict | Q.Refused)


def test_due_lists_lapsed_leases_and_passed_deadlines_only() -> None:
    live = Q.claim(item("fatal"), Q.Actor("a"), now=T0, lease_s=60)
    lapsed = Q.claim(item("loop"), Q.Actor("a"), now=T0, lease_s=5)
    assert Q.due([live, lapsed], T0 + timedelta(seconds=10)) == [lapsed]
    assert {i.kind for i in Q.due([live, lapsed], T0 + timedelta(hours=2))} == {"fatal", "loop"}


# --- SLAs ------------------------------------------------------------------------------------------


def test_every_kind_has_a_deadline_and_a_default_action() -> None:
    assert set(Q.DEFAULT_SLAS) == {
        "fatal", "unknown_outcome", "schema_cap", "ask_human", "not_judged", "loop", "approval", "spawn", "stalled",
    }  # fmt: skip
    rules = Q.sla_rules({"ask_human": {"after_s": 5}, "spawn": {"action": "abort"}})
    assert rules["ask_human"] == Q.SlaRule(5.0, "fall_back") and rules["spawn"] == Q.SlaRule(3600.0, "abort")


def test_the_sla_resolves_an_item_past_its_deadline_and_says_so() -> None:
    it = item("fatal")
    assert Q.apply_sla(it, T0 + timedelta(minutes=59)) is None
    applied = Q.apply_sla(it, T0 + timedelta(hours=1))
    assert applied is not None
    resolved, resolution = applied
    assert resolution.by_sla and resolution.resolved_by == "sla" and resolution.action == "abort"
    assert resolved.status == "resolved" and resolved.trail[-1].kind == "sla_applied"
    assert Q.apply_sla(resolved, T0 + timedelta(hours=2)) is None  # once


@pytest.mark.parametrize(
    ("kind", "sla", "details", "action"),
    [
        ("approval", "deny", {}, "reject"),
        ("fatal", "deny", {}, "abort"),
        ("not_judged", "accept_if_judged", {"score": 0.9, "threshold": 0.8}, "approve"),
        ("not_judged", "accept_if_judged", {}, "reject"),
        ("ask_human", "fall_back", {}, "resume"),
        ("spawn", "fall_back", {}, "reject"),
        ("loop", "abort", {}, "abort"),
    ],
)
def test_sla_default_actions_map_to_what_the_kind_allows(
    kind: str, sla: str, details: dict[str, object], action: str
) -> None:
    chosen, note = Q.sla_resolution_action(item(kind, **details), sla)  # type: ignore[arg-type]
    assert chosen == action and "SLA" in note
    assert chosen in Q.allowed_actions(kind)  # type: ignore[arg-type]


# --- resolutions ------------------------------------------------------------------------------------


def test_each_kind_offers_its_actions() -> None:
    assert Q.allowed_actions("schema_cap") == ["provide_result", "retry", "resume", "final_answer", "abort"]
    assert "approve" in Q.allowed_actions("not_judged") and "provide_result" not in Q.allowed_actions("not_judged")
    assert Q.allowed_actions("spawn") == ["approve", "reject", "abort"]
    assert item("ask_human").allowed_actions == Q.allowed_actions("ask_human")


@pytest.mark.parametrize(
    ("kind", "req", "error"),
    [
        ("fatal", resolve("approve"), "does not apply to a fatal"),
        ("fatal", resolve("provide_result"), "needs the tool's result"),
        ("fatal", resolve("final_answer", result="  "), "needs the answer as text"),
        ("fatal", resolve("retry"), "needs an instruction"),
        ("approval", resolve("provide_result", result={}), "does not apply to a approval"),
    ],
)
def test_a_resolution_that_does_not_fit_is_refused_with_the_reason(
    kind: str, req: EscalationResolve, error: str
) -> None:
    with pytest.raises(Q.QueueError, match=error):
        Q.resolve(item(kind), req, Q.Actor("alice"), now=T0)


def test_a_result_that_breaks_the_contract_is_refused() -> None:
    with pytest.raises(Q.QueueError, match=re.escape("breaks the output contract of 't': $.result: must be a number")):
        Q.resolve(
            item(),
            resolve("provide_result", result={}),
            Q.Actor("a"),
            now=T0,
            result_errors=["$.result: must be a number"],
        )


def test_the_resolution_records_the_verified_operator_and_the_service_that_acted() -> None:
    resolved, resolution = Q.resolve(item(), resolve("abort", "stop"), Q.Actor("alice", "console"), now=T0)
    assert (resolution.resolved_by, resolution.via, resolution.by_sla) == ("alice", "console", False)
    assert resolved.trail[-1].operator == "alice" and resolved.trail[-1].via == "console"


# --- listing -----------------------------------------------------------------------------------------


def test_filters_by_state_kind_tool_run_and_age() -> None:
    a, b = item("fatal"), item("loop").model_copy(update={"created_at": T0 - timedelta(minutes=10), "tool": "x"})
    now = T0 + timedelta(seconds=30)
    assert Q.select([a, b], EscalationQuery(), now) == [b, a]  # oldest first
    assert Q.select([a, b], EscalationQuery(kind="loop"), now) == [b]
    assert Q.select([a, b], EscalationQuery(tool="t"), now) == [a]
    assert Q.select([a, b], EscalationQuery(older_than_s=60), now) == [b]
    assert Q.select([a, b], EscalationQuery(newer_than_s=60), now) == [a]
    assert Q.select([a, b], EscalationQuery(run_id="other"), now) == []
    assert Q.select([a, b], EscalationQuery(status="claimed"), now) == []
