"""A run as a tree of timed steps (``loopwarden.runtree``), from recorded runs of the shipped scenarios."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from loopwarden import runtree as T
from shared.messages import RateLimited, RateLimitedDetail
from shared.records import EventRecord, RunRecord

DATA = Path(__file__).parent / "data"


def record(name: str) -> RunRecord:
    return RunRecord.model_validate_json((DATA / f"run-{name}.json").read_text())


def only_events(rec: RunRecord) -> RunRecord:
    """What the console's user can read in a locked deployment: the run state and the events."""
    return rec.model_copy(update={"model_calls": [], "tool_calls": [], "verdicts": [], "escalations": []})


def sections(rec: RunRecord, step_id: str) -> dict[str, T.Section]:
    return {s.key: s for s in T.step_detail(rec, step_id)}


# --- the tree -----------------------------------------------------------------------------------------


def test_a_run_is_iterations_of_model_turn_tool_calls_and_decide_with_the_end_reason_on_top() -> None:
    tree = T.build(record("malformed-output-corrected"))
    assert [s.id for s in tree.steps] == ["i1", "i2", "i3", "end"]
    assert [c.kind for c in tree.steps[0].children] == ["model", "tool", "decide"]
    assert tree.decide == "row 5: complete — terminal tool ran in this iteration"
    assert tree.end_reason == "terminal tool ran in this iteration"
    assert tree.status == "completed"


def test_every_step_lies_on_one_time_axis_inside_the_run() -> None:
    tree = T.build(record("demo"))
    assert tree.span_s > 0
    for _, step in tree.walk():
        assert 0 <= step.start_s <= tree.span_s
        assert step.end_s is not None and step.start_s <= step.end_s <= tree.span_s + 1e-9
    i1 = tree.steps[0]
    assert i1.children[0].end_s is not None and i1.children[0].end_s <= i1.children[1].start_s  # turn, then its call


def test_tokens_and_cost_are_the_model_turns_and_the_judges_summed_per_iteration() -> None:
    tree = T.build(record("demo"))
    model, judge = tree.find("i1.model"), tree.find("i3.judge")
    assert model is not None and model.input_tokens == 1018 and model.cost_usd > 0
    assert judge is not None and judge.cost_usd == pytest.approx(0.000628)
    turns = sum(s.cost_usd for _, s in tree.walk() if s.kind == "model")
    assert turns == pytest.approx(tree.cost_usd)  # the run's usage is its model turns; the judge is billed apart
    assert sum(s.cost_usd for s in tree.steps) == pytest.approx(turns + judge.cost_usd)


def test_a_broken_output_is_a_failed_call_with_its_validation_step_naming_the_paths() -> None:
    tree = T.build(record("malformed-output-corrected"))
    call = tree.find("i1.tool.toolu_001_01")
    assert call is not None and call.status == "failed" and call.summary.startswith("output_invalid:")
    validation = tree.find("i1.tool.toolu_001_01.validation")
    assert validation is not None and validation.status == "failed"
    assert validation.summary == "2 output error(s) at $, $.results[0]"
    assert tree.steps[0].status == "failed" and tree.steps[1].status == "ok"
    assert [s.id for s in tree.failures] == ["i1.tool.toolu_001_01", "i1.tool.toolu_001_01.validation"]


def test_a_transient_failure_is_a_retried_attempt_and_a_repair_is_shown_on_the_call() -> None:
    tree = T.build(record("demo"))
    call = tree.find("i1.tool.toolu_001_01")
    assert call is not None and call.status == "repaired" and "2 attempt(s)" in call.summary
    assert [(a.title, a.status) for a in call.children if a.kind == "attempt"] == [
        ("attempt 1", "retried"),
        ("attempt 2", "ok"),
    ]
    validation = tree.find("i1.tool.toolu_001_01.validation")
    assert validation is not None and "numeric_string_to_integer" in validation.summary


def test_the_judge_step_carries_each_criterions_score() -> None:
    judge = T.build(record("demo")).find("i3.judge")
    assert judge is not None and judge.status == "ok"
    assert "accuracy 0.95" in judge.summary and "cites a source 1.00" in judge.summary


def test_an_escalation_waits_where_it_happened_and_the_run_has_no_end_yet() -> None:
    tree = T.build(record("correction-escalates"))
    assert [s.id for s in tree.steps] == ["i1", "i2", "i3"]
    esc = [c for c in tree.steps[2].children if c.kind == "escalation"]
    assert len(esc) == 1 and esc[0].status == "waiting" and esc[0].end_s is None
    assert tree.steps[2].status == "escalated"


def test_the_tree_is_the_same_from_the_events_alone() -> None:
    full, bare = T.build(record("demo")), T.build(only_events(record("demo")))
    assert [(s.id, s.status, s.summary) for _, s in full.walk()] == [
        (s.id, s.status, s.summary) for _, s in bare.walk()
    ]


# --- a step, opened -------------------------------------------------------------------------------------


def test_an_opened_call_shows_the_raw_output_the_error_paths_and_the_correction() -> None:
    got = sections(record("malformed-output-corrected"), "i1.tool.toolu_001_01")
    assert got["raw-output"].body["score"] == 0.7
    assert [e["path"] for e in got["errors"].body] == ["$.results[0]", "$"]
    assert got["seen"].text.startswith("✗ The tool 'search' returned output that breaks its output contract")
    assert "corrected" in got["correction"].text


def test_an_opened_model_turn_shows_what_was_sent_and_what_came_back() -> None:
    got = sections(record("malformed-output-corrected"), "i2.model")
    assert len(got["conversation"].body) == 3  # the task, the first call, its result
    assert got["sent"].body["cache"]["read (cached) tokens"] == 1223
    assert got["response"].body["stop reason"] == "tool_use"
    assert got["response"].body["text"] == "That result broke its contract; asking again more precisely."


def test_an_opened_judge_shows_score_weight_hard_and_reason_per_criterion() -> None:
    crit = sections(record("demo"), "i3.judge")["criteria"].body
    assert crit[0] == {
        "name": "accuracy",
        "score": 0.95,
        "weight": 2.0,
        "hard": False,
        "passed": True,
        "reason": "Correct mechanism and window; 120 s matches the 2-minute default.",
    }
    assert [c["hard"] for c in crit] == [False, True, False]


def test_an_opened_judge_reads_the_verdict_event_when_the_verdict_bucket_is_not_readable() -> None:
    crit = sections(only_events(record("demo")), "i3.judge")["criteria"].body
    assert [c["name"] for c in crit] == ["accuracy", "cites a source", "concise"]


def test_an_opened_escalation_says_it_waits_for_a_person() -> None:
    rec = record("correction-escalates")
    esc = next(e.payload["escalation_id"] for e in rec.events if e.kind == "escalation.raised")
    got = sections(rec, f"esc.{esc}")
    assert got["raised"].body["kind"] == "schema_cap"
    assert got["resolution"].text == "waiting for a person"


def test_an_unknown_step_opens_to_nothing() -> None:
    assert T.step_detail(record("demo"), "i9.tool.nope") == []
    assert T.step_detail(record("demo"), "../etc") == []


# --- cutting text ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "limit", "expected"),
    [
        ("short", 10, "short"),
        ("the quick brown fox", 12, "the quick…"),
        ("the quick brown fox", 11, "the quick…"),
        ("one\nline  only", 20, "one line only"),
        ("abcdefghijklmnop", 8, "abcdefg…"),
    ],
)
def test_text_is_cut_at_a_word_boundary_with_a_visible_ellipsis(text: str, limit: int, expected: str) -> None:
    assert T.clip(text, limit) == expected
    assert len(T.clip(text, limit)) <= limit


# --- a wait for the provider's rate limit -------------------------------------------------------------------


def with_wait(rec: RunRecord, until_model: bool) -> RunRecord:
    """The demo run with its first turn held 0.2 s for the rate limit (and, unless ``until_model``, still
    held: the run cut off before the turn's answer)."""
    started = rec.events[0]
    assert started.time is not None
    detail = RateLimitedDetail(
        provider="anthropic",
        account="0123456789ab",
        purpose="plan",
        wait_s=0.2,
        until=started.time + timedelta(seconds=0.25),
        reason="capacity",
        dimension="requests",
    )
    waited = RateLimited(run_id=rec.run_id, iteration=1, summary="waiting for the rate limit", detail=detail)
    event = EventRecord(
        subject=f"lw.v1.evt.run.rate_limited.{rec.run_id}",
        kind="run.rate_limited",
        seq=1,
        time=started.time + timedelta(seconds=0.05),
        payload=waited.model_dump(mode="json"),
    )
    later = [e.model_copy(update={"seq": e.seq + 1}) for e in rec.events[1:]]
    events = [started, event, *(later if until_model else [])]
    return rec.model_copy(update={"events": events, "status": "completed" if until_model else "running"})


def test_a_wait_for_the_rate_limit_is_a_step_of_its_iteration_with_how_long_and_why() -> None:
    tree = T.build(with_wait(record("demo"), until_model=True))
    wait = tree.find("i1.wait1")
    assert wait is not None and wait.title == "waiting for the rate limit" and wait.status == "ok"
    assert wait.duration_s == pytest.approx(0.2)
    assert wait.summary == "0.2s · anthropic key 0123456789ab · requests"
    model = tree.find("i1.model")
    assert model is not None and model.start_s == 0.0  # the turn still starts where the iteration did
    detail = sections(with_wait(record("demo"), until_model=True), "i1.wait1")["rate_limit"]
    assert isinstance(detail.body, dict) and detail.body["reason"] == "capacity"


def test_a_wait_still_going_shows_as_waiting() -> None:
    tree = T.build(with_wait(record("demo"), until_model=False))
    wait = tree.find("i1.wait1")
    assert wait is not None and wait.status == "waiting"
