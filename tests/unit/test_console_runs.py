"""The runs list's filters and pages (``loopwarden.console.board``), and the waterfall's geometry and the
durations the console and the terminal both print (``loopwarden.runtree.timing``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from loopwarden import runtree as RT
from loopwarden.console import board as B


def row(i: int, status: str = "completed", **extra: object) -> B.RunRow:
    record = {
        "run_id": f"run-{i}",
        "task": f"task number {i}",
        "status": status,
        "updated_at": f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}Z",
        "usage": {"cost_usd": i / 1000},
        "config": {"tenant": extra.get("tenant", "acme")},
        "tool_history": [[t, "x"] for t in extra.get("tools", ["search"])],  # type: ignore[attr-defined]
        "agent": extra.get("agent"),
    }
    return B.run_row(f"run-{i}", json.dumps(record).encode())


NOW = B.run_row("x", json.dumps({"updated_at": "2026-01-01T01:00:00Z"}).encode()).updated_ts


def test_a_filter_of_a_query_reads_every_field_and_names_a_bad_value() -> None:
    flt = B.RunFilter.from_query({"status": "failed", "min_cost": "$0.5", "newer_than": "5m", "q": " ada "})
    assert (flt.status, flt.min_cost_usd, flt.newer_than_s, flt.q) == ("failed", 0.5, 300.0, "ada")
    with pytest.raises(ValueError, match="cost 'lots': a number of dollars"):
        B.RunFilter.from_query({"min_cost": "lots"})
    with pytest.raises(ValueError, match="age 'soon'"):
        B.RunFilter.from_query({"older_than": "soon"})


def test_runs_are_filtered_by_status_agent_tenant_tool_failure_text_age_and_cost() -> None:
    rows = [
        row(1, agent="restock"),
        row(2, "failed", tenant="zeta"),
        row(3, "failed", tools=["calculator"]),
        row(40, "failed", agent="restock"),
    ]
    failures = {"run-2": {"output_invalid"}}

    def ids(**q: str) -> list[str]:
        return [r.run_id for r in B.select_runs(rows, B.RunFilter.from_query(q), failures, NOW).rows]

    assert ids() == ["run-40", "run-3", "run-2", "run-1"]  # newest first
    assert ids(status="failed") == ["run-40", "run-3", "run-2"]
    assert ids(tenant="zeta") == ["run-2"]
    assert ids(agent="restock") == ["run-40", "run-1"]
    assert ids(agent="restock", status="failed") == ["run-40"]
    assert ids(tool="calculator") == ["run-3"]
    assert ids(failure="output_invalid") == ["run-2"]
    assert ids(q="NUMBER 4") == ["run-40"]
    assert ids(min_cost="0.003") == ["run-40", "run-3"]
    assert ids(newer_than="3580") == ["run-40"]  # updated 3560 s before NOW; the others about 3598 s
    assert ids(older_than="3590s") == ["run-3", "run-2", "run-1"]


def test_runs_come_in_pages_and_a_page_past_the_end_is_the_last() -> None:
    rows = [row(i) for i in range(120)]
    first = B.select_runs(rows, B.RunFilter(), {}, NOW, page=1)
    assert (first.total, first.pages, len(first.rows), first.rows[0].run_id) == (120, 3, 50, "run-119")
    last = B.select_runs(rows, B.RunFilter(), {}, NOW, page=9)
    assert (last.page, len(last.rows), last.rows[-1].run_id) == (3, 20, "run-0")


def test_a_steps_bar_sits_on_the_runs_axis_and_an_instant_is_still_visible() -> None:
    assert RT.bar(0.0, 0.5, 1.0) == (0, 500)
    assert RT.bar(0.25, 0.5, 1.0) == (250, 250)
    assert RT.bar(1.0, 1.0, 1.0) == (996, 4)
    assert RT.bar(0.5, None, 1.0) == (500, 500)  # still going: to the end of the axis
    assert RT.bar(0.0, 0.0, 0.0) == (0, 4)


@pytest.mark.parametrize(
    ("seconds", "text"), [(None, ""), (0.0042, "4 ms"), (0.85, "850 ms"), (2.44, "2.4 s"), (185, "3 m 05 s")]
)
def test_a_duration_reads_as_people_write_it(seconds: float | None, text: str) -> None:
    assert RT.duration(seconds) == text


# --- a queue item's buttons --------------------------------------------------------------------------------

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_an_open_item_offers_claim_and_resolve_and_says_a_resolution_needs_no_claim() -> None:
    c = B.item_controls("open", None, None, "alice", T0)
    assert (c.claim, c.renew, c.resolve) == (True, False, True)
    assert "resolve it now (no claim needed)" in c.note


def test_an_item_one_holds_offers_renew_not_claim() -> None:
    c = B.item_controls("claimed", "alice", T0 + timedelta(seconds=30), "alice", T0)
    assert (c.claim, c.renew, c.resolve) == (False, True, True)


def test_an_item_someone_else_holds_offers_nothing_until_their_lease_ends() -> None:
    c = B.item_controls("claimed", "bob", T0 + timedelta(seconds=30), "alice", T0)
    assert (c.claim, c.renew, c.resolve) == (False, False, False) and c.note.startswith("held by bob")
    lapsed = B.item_controls("claimed", "bob", T0 - timedelta(seconds=1), "alice", T0)
    assert (lapsed.claim, lapsed.resolve) == (True, True)


def test_a_resolved_item_is_read_only() -> None:
    c = B.item_controls("resolved", "bob", None, "bob", T0)
    assert (c.claim, c.renew, c.resolve) == (False, False, False) and "read-only" in c.note


def test_the_sla_counts_down() -> None:
    assert RT.countdown(T0 + timedelta(seconds=245), T0) == "in 4 m 05 s"
    assert RT.countdown(T0 - timedelta(seconds=1), T0) == "due now"
    assert RT.countdown(None, T0) == ""


def test_an_example_has_the_output_schemas_shape() -> None:
    schema = {
        "oneOf": [
            {
                "type": "object",
                "properties": {
                    "status": {"const": "ok"},
                    "result": {"type": "number"},
                    "expression": {"type": "string"},
                    "note": {"type": "string"},
                },
                "required": ["status", "expression", "result"],
            },
            {"type": "object", "properties": {"status": {"const": "error"}}},
        ]
    }
    assert B.example_of(schema) == {"status": "ok", "result": 0, "expression": ""}
    assert B.example_of({"type": "array", "items": {"enum": ["a", "b"]}}) == ["a"]
