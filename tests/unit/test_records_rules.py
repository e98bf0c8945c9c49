"""Run records, the pure parts: retention rules, record -> scenario, comparing two runs' decisions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from shared.records import (
    EventRecord,
    RunRecord,
    divergences,
    escalation_expired,
    run_expired,
    scenario_from_record,
    trajectory,
)
from shared.scenario import parse_scenario

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def test_only_a_finished_run_expires_and_only_after_its_retention() -> None:
    old = NOW - timedelta(days=400)
    assert run_expired("completed", old, NOW, 7 * 86400)
    assert run_expired("failed", NOW - timedelta(seconds=10), NOW, 10)
    assert not run_expired("completed", NOW - timedelta(seconds=9), NOW, 10)
    for waiting in ("running", "awaiting_human"):
        assert not run_expired(waiting, old, NOW, 0)  # never, however old


def test_a_queue_item_expires_only_once_resolved_after_its_own_retention() -> None:
    resolved = {"status": "resolved", "resolution": {"resolved_at": (NOW - timedelta(days=31)).isoformat()}}
    assert escalation_expired(resolved, NOW, 30 * 86400)
    assert not escalation_expired(resolved, NOW, 40 * 86400)
    for status in ("open", "claimed"):
        assert not escalation_expired({"status": status, "created_at": "2000-01-01T00:00:00Z"}, NOW, 0)


def ev(seq: int, kind: str, **payload: Any) -> EventRecord:
    return EventRecord(subject=f"lw.v1.evt.{kind}.r", kind=kind, seq=seq, payload=payload)


def test_trajectory_and_the_first_divergence_per_kind() -> None:
    recorded = [
        ev(1, "tool.attempt.search", attempt_id="a1", ok=False),
        ev(2, "failure.transient.search", iteration=1, will_retry=True),
        ev(3, "tool.succeeded.search", iteration=1, repaired=True),
        ev(4, "run.decided", iteration=1, detail={"row": 2, "action": "continue"}),
        ev(5, "budget.warn", iteration=2),
        ev(6, "run.decided", iteration=2, detail={"row": 5, "action": "complete"}),
    ]
    steps = trajectory(recorded)
    assert [(s.what, s.value) for s in steps] == [
        ("validation", "valid (repaired)"),
        ("decide", "row 2: continue"),
        ("budget", "warn"),
        ("decide", "row 5: complete"),
    ]
    assert divergences(steps, trajectory(recorded)) == []
    replayed = [
        ev(3, "failure.output_invalid.search", iteration=1),
        ev(4, "run.decided", iteration=1, detail={"row": 2, "action": "continue"}),
        ev(6, "run.decided", iteration=2, detail={"row": 3, "action": "retry"}),
    ]
    assert divergences(steps, trajectory(replayed)) == [
        "decide #2: recorded iteration 2: row 5: complete; replay iteration 2: row 3: retry",
        "validation #1: recorded iteration 1 search: valid (repaired); replay iteration 1 search: output_invalid",
        "budget #1: recorded iteration 2: warn; replay (nothing)",
    ]


def test_a_record_becomes_a_scenario_that_loads() -> None:
    record = RunRecord.model_validate(
        {
            "run_id": "r1",
            "exported_at": NOW.isoformat(),
            "task": "t",
            "status": "completed",
            "final_output": "42",
            "provider": "live",
            "config": {"answer_mode": "auto", "terminal_tools": ["submit_result"], "max_iterations": 5},
            "model_calls": [
                {"key": "r1.turn2", "purpose": "plan", "n": 2, "response": {"text": "done", "usage": {}}},
                {
                    "key": "r1.turn1",
                    "purpose": "plan",
                    "n": 1,
                    "response": {
                        "text": "",
                        "tool_calls": [{"id": "t1", "name": "calc", "input": {"e": "6*7"}}],
                        "usage": {"input_tokens": 10, "output_tokens": 2},
                    },
                },
            ],
            "tool_calls": [
                {
                    "attempt_id": "r1.i1.t1",
                    "iteration": 1,
                    "call_id": "t1",
                    "tool": "calc",
                    "attempts": [{"attempt": 1, "ok": False, "failure_type": "timeout"}, {"attempt": 2, "ok": True}],
                    "raw_output": {"result": 42},
                    "has_output": True,
                }
            ],
            "verdicts": [{"status": "passed", "criteria": [{"name": "right", "score": 0.9, "reason": "ok"}]}],
        }
    )
    data = scenario_from_record(record)
    scenario = parse_scenario(data)
    assert [t.text for t in scenario.planner] == ["", "done"]  # in turn order
    assert scenario.planner[0].tool_calls[0].id == "t1" and scenario.planner[0].usage is not None
    assert [(b.fail, b.output) for b in scenario.tools["calc"]] == [("timeout", None), (None, {"result": 42})]
    assert scenario.judge[0].scores == {"right": 0.9}
    assert scenario.limits is not None and scenario.limits.max_iterations == 5
    assert scenario.expect is not None and scenario.expect.final_output_equals == "42"
