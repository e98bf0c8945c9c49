"""The console's pure parts: run rows from stored records (broken ones included), timelines and trace
links, age filters, and signed sessions."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from services.console import board as B
from services.console.auth import Sessions, hash_password


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


def test_a_session_names_its_operator_until_it_expires_or_is_revoked() -> None:
    users = {"alice": hash_password("pw", rounds=4), "bob": hash_password("pw2", rounds=4)}
    sessions = Sessions(users, secret=b"k" * 32, ttl_s=60)
    assert sessions.login("alice", "wrong") is None and sessions.login("mallory", "pw") is None
    token = sessions.login("alice", "pw", now=1000.0)
    assert token is not None
    assert sessions.operator(token, now=1059.0) == "alice"
    assert sessions.operator(token, now=1061.0) is None  # expired
    other_replica = Sessions(sessions.users, secret=b"k" * 32)
    assert other_replica.operator(token, now=1001.0) == "alice"  # same secret: any replica accepts it
    assert Sessions(sessions.users, secret=b"x" * 32).operator(token, now=1001.0) is None
    body, signature = token.rsplit(".", 1)
    forged = forge_body(body, "bob")
    assert sessions.operator(f"{forged}.{signature}", now=1001.0) is None  # a changed body breaks the signature
    sessions.logout(token)
    assert sessions.operator(token, now=1001.0) is None


def forge_body(body: str, operator: str) -> str:
    import base64

    _name, expires, nonce = json.loads(base64.urlsafe_b64decode(body.encode()))
    return base64.urlsafe_b64encode(json.dumps([operator, expires, nonce]).encode()).decode()
