"""The console's pure parts: run rows from stored records (broken ones included), timelines and trace
links, age filters, signed sessions and their revocation, the login throttle, and what a post must come
from."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from loopwarden.console import board as B
from loopwarden.console import guard as G
from loopwarden.console.auth import PasswordTooLong, Sessions, cost_of, hash_password
from loopwarden.console.throttle import LoginThrottle


def test_a_run_row_reads_status_cost_and_progress() -> None:
    raw = {
        "run_id": "r1",
        "status": "awaiting_human",
        "task": "Add one and one.",
        "usage": {"cost_usd": 0.0123, "input_tokens": 900, "output_tokens": 40},
        "iteration": {"n": 3},
        "model_calls": 3,
        "updated_at": "2026-11-30T12:00:01Z",
        "awaiting": {"escalation_id": "e1", "kind": "schema_cap"},
        "a_field_from_a_newer_planner": True,
    }
    row = B.run_row("r1", json.dumps(raw).encode())
    assert (row.status, row.cost_usd, row.iterations, row.model_calls) == ("awaiting_human", 0.0123, 3, 3)
    assert row.awaiting == {"escalation_id": "e1", "kind": "schema_cap"} and row.readable


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b""])
def test_a_broken_run_record_is_a_row_that_says_so(raw: bytes) -> None:
    row = B.run_row("r-broken", raw)
    assert row.status == "unreadable" and not row.readable and "does not parse" in row.task


def test_the_trace_comes_from_the_first_traceparent_and_links_to_jaeger() -> None:
    timeline = B.RunTimeline()
    at = datetime(2026, 11, 30, 12, 0, 5, tzinfo=UTC)
    B.add_event(timeline, B.timeline_entry(1, "lw.v1.evt.run.started", b'{"summary": "go"}', at), None)
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    B.add_event(timeline, B.timeline_entry(2, "lw.v1.evt.run.completed", b"{}", at), tp)
    assert timeline.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert [(e.kind, e.summary, e.at) for e in timeline.entries] == [
        ("run.started", "go", "12:00:05"),
        ("run.completed", "", "12:00:05"),
    ]
    assert (
        B.jaeger_link("http://j:16686/", timeline.trace_id) == "http://j:16686/trace/4bf92f3577b34da6a3ce929d0e0e4736"
    )
    assert B.jaeger_link("http://j:16686", None) is None
    assert B.trace_id_of("00-" + "0" * 32 + "-00f067aa0ba902b7-01") is None and B.trace_id_of("junk") is None


def test_timeline_entries_name_who_resolved_and_through_what() -> None:
    body = {"action": "provide_result", "resolved_by": "alice", "via": "console", "note": "by hand", "by_sla": False}
    entry = B.timeline_entry(3, "lw.v1.evt.escalation.resolved", json.dumps(body).encode(), None)
    assert entry.summary == "provide_result by alice via console: by hand"
    sla = {"action": "abort", "resolved_by": "sla", "by_sla": True}
    assert B.timeline_entry(4, "lw.v1.evt.escalation.resolved", json.dumps(sla).encode(), None).summary == (
        "abort by the SLA"
    )
    refused = {"operator": "bob", "via": "console", "reason": "bob may not act on fatal escalations"}
    assert B.timeline_entry(5, "lw.v1.evt.escalation.refused", json.dumps(refused).encode(), None).summary == (
        "bob via console: bob may not act on fatal escalations"
    )


def test_a_validated_result_has_a_summary_in_the_timeline() -> None:
    body = {"tool": "search", "success": True, "repaired": True, "cached": False}
    entry = B.timeline_entry(6, "lw.v1.evt.tool.succeeded.search.r1", json.dumps(body).encode(), None)
    assert (entry.kind, entry.summary) == ("tool.succeeded.search", "validated (repaired)")


def test_a_timeline_keeps_the_latest_events_only() -> None:
    timeline = B.RunTimeline()
    for i in range(B.MAX_EVENTS_PER_RUN + 5):
        B.add_event(timeline, B.TimelineEntry(i, "", "run.x", ""), None)
    assert len(timeline.entries) == B.MAX_EVENTS_PER_RUN and timeline.entries[-1].seq == B.MAX_EVENTS_PER_RUN + 4


@pytest.mark.parametrize(("text", "seconds"), [("", None), ("90", 90.0), ("30s", 30.0), ("5m", 300.0), ("2h", 7200.0)])
def test_ages_are_read_in_seconds_minutes_or_hours(text: str, seconds: float | None) -> None:
    assert B.parse_age(text) == seconds


@pytest.mark.parametrize("text", ["soon", "-5m", "5x"])
def test_a_bad_age_says_what_is_accepted(text: str) -> None:
    with pytest.raises(ValueError, match="age"):
        B.parse_age(text)


async def test_a_session_names_its_operator_until_it_expires_or_is_revoked() -> None:
    users = {"alice": hash_password("pw", rounds=4), "bob": hash_password("pw2", rounds=4)}
    sessions = Sessions(users, secret=b"k" * 32, ttl_s=60)
    assert await sessions.login("alice", "wrong") is None and await sessions.login("mallory", "pw") is None
    token = await sessions.login("alice", "pw", now=1000.0)
    assert token is not None
    assert await sessions.operator(token, now=1059.0) == "alice"
    assert await sessions.operator(token, now=1061.0) is None  # expired
    other_replica = Sessions(sessions.users, secret=b"k" * 32, revocations=sessions.revocations)
    assert await other_replica.operator(token, now=1001.0) == "alice"  # same secret: any replica accepts it
    assert await Sessions(sessions.users, secret=b"x" * 32).operator(token, now=1001.0) is None
    body, signature = token.rsplit(".", 1)
    forged = forge_body(body, "bob")
    assert await sessions.operator(f"{forged}.{signature}", now=1001.0) is None  # a changed body breaks the signature
    await sessions.logout(token, now=1001.0)
    assert await sessions.operator(token, now=1001.0) is None
    assert await other_replica.operator(token, now=1001.0) is None  # revoked where every replica looks


async def test_a_password_over_72_bytes_is_refused_before_any_work_known_operator_or_not() -> None:
    sessions = Sessions({"alice": hash_password("pw", rounds=4)}, secret=b"k" * 32)
    for name in ("alice", "mallory"):
        with pytest.raises(PasswordTooLong, match="at most 72 bytes"):
            await sessions.login(name, "a" * 73)
    assert await sessions.login("alice", "é" * 36) is None  # 72 bytes: checked, merely wrong


def test_an_unknown_name_is_checked_against_a_hash_of_the_operators_cost() -> None:
    sessions = Sessions({"alice": hash_password("pw", rounds=5)}, secret=b"k" * 32)
    assert cost_of(sessions.dummy().decode()) == 5
    assert cost_of(Sessions({}, secret=b"k" * 32).dummy().decode()) == 12


def test_a_failed_login_is_logged_without_what_was_typed_unless_it_is_an_operator() -> None:
    sessions = Sessions({"alice": hash_password("pw", rounds=4)}, secret=b"k" * 32)
    assert sessions.who("alice") == "'alice'"
    line = sessions.who("hunter2-typed-in-the-wrong-field")
    assert "hunter2" not in line and line.startswith("an unknown name #")
    assert line == sessions.who("hunter2-typed-in-the-wrong-field")  # attempts still correlate
    assert line != Sessions({}, secret=b"x" * 32).who("hunter2-typed-in-the-wrong-field")  # keyed


def test_a_form_token_belongs_to_its_session() -> None:
    sessions = Sessions({"alice": hash_password("pw", rounds=4)}, secret=b"k" * 32)
    one, two = (sessions.verify(sessions.issue("alice")) for _ in range(2))
    assert one is not None and two is not None
    assert sessions.csrf_ok(one, sessions.csrf(one)) and not sessions.csrf_ok(one, sessions.csrf(two))
    assert not sessions.csrf_ok(one, "")


# --- login throttle -------------------------------------------------------------------------------


def test_a_name_waits_longer_after_each_failure_past_the_free_ones_and_a_success_clears_it() -> None:
    throttle = LoginThrottle(free_by_address=100, free_by_name=3, base_s=5.0)
    for i in range(3):
        assert throttle.attempt(f"10.0.0.{i}", "alice", now=100.0) is None  # from anywhere: the name counts
    refused = throttle.attempt("10.0.0.9", "alice", now=101.0)
    assert refused is not None and refused.by == "operator" and refused.wait_s == pytest.approx(4.0)
    assert "for this operator: try again in 4 s" in refused.message
    assert throttle.attempt("10.0.0.9", "alice", now=105.0) is None  # 4th strike at 105
    again = throttle.attempt("10.0.0.9", "alice", now=106.0)
    assert again is not None and again.wait_s == pytest.approx(9.0)  # 10 s after the 4th
    throttle.succeeded("10.0.0.9", "alice")
    assert throttle.attempt("10.0.0.9", "alice", now=106.0) is None


def test_an_address_is_throttled_across_names_and_strikes_are_forgotten_after_a_quiet_spell() -> None:
    throttle = LoginThrottle(free_by_address=4, free_by_name=100, base_s=5.0, forget_s=60.0)
    results = [throttle.attempt("10.0.0.1", f"name{i}", now=0.0) for i in range(6)]  # a concurrent burst
    assert results[:4] == [None] * 4 and all(r is not None and r.by == "address" for r in results[4:])
    assert throttle.attempt("10.0.0.2", "name9", now=0.0) is None  # another address is not held up
    assert throttle.attempt("10.0.0.1", "name9", now=61.0) is None


def test_the_throttle_holds_a_bounded_number_of_keys() -> None:
    throttle = LoginThrottle(max_keys=10)
    for i in range(100):
        throttle.attempt("10.0.0.1", f"name{i}", now=0.0)
    assert len(throttle._strikes) <= 10


# --- what the browser is told, and which posts are taken ---------------------------------------------


@pytest.mark.parametrize(
    ("origin", "referer", "taken"),
    [
        ("http://127.0.0.1:8700", None, True),
        ("http://127.0.0.1:8701", None, False),  # another port of the same host: same site, not same origin
        ("http://jaeger.example.org", "http://127.0.0.1:8700/queue", False),  # Origin wins over Referer
        ("null", None, False),
        (None, "http://127.0.0.1:8700/escalations/e1", True),
        (None, "http://127.0.0.1:9999/evil", False),
        (None, None, False),
    ],
)
def test_a_post_is_taken_only_from_the_consoles_own_origin(
    origin: str | None, referer: str | None, taken: bool
) -> None:
    own = G.own_origin("http", "127.0.0.1:8700", None)
    assert (G.origin_refusal(origin, referer, own) is None) is taken


def test_behind_a_proxy_the_public_address_is_the_origin() -> None:
    own = G.own_origin("http", "console:8700", "https://console.example.org/")
    assert own == "https://console.example.org"
    assert G.origin_refusal("https://console.example.org", None, own) is None


def test_pages_run_only_nonced_script_and_cannot_be_framed() -> None:
    headers = G.security_headers("n0nce")
    csp = headers["Content-Security-Policy"]
    assert "script-src 'nonce-n0nce'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
    assert headers["X-Frame-Options"] == "DENY" and headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Referrer-Policy"] == "same-origin"


def forge_body(body: str, operator: str) -> str:
    import base64

    _name, expires, nonce = json.loads(base64.urlsafe_b64decode(body.encode()))
    return base64.urlsafe_b64encode(json.dumps([operator, expires, nonce]).encode()).decode()
