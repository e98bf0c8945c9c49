"""The progress lines read the typed events' fields, not their summaries."""

from __future__ import annotations

from datetime import UTC, datetime

from loopwarden.client import Event
from loopwarden.progress import render
from shared.messages import (
    BudgetDecision,
    Decided,
    DecidedDetail,
    ModelCalled,
    ModelCalledDetail,
    RateLimited,
    RateLimitedDetail,
    RequestedCall,
    Started,
    StartedDetail,
    ToolOutcome,
    ToolSucceeded,
    ToolSucceededDetail,
)


def event(subject: str, payload: dict[str, object]) -> Event:
    return Event(subject=f"lw.v1.evt.{subject}.r1", payload=payload, run_id="r1")


def test_a_model_turn_line_comes_from_its_fields_whatever_the_summary_says() -> None:
    ev = ModelCalled(
        run_id="r1",
        iteration=2,
        summary="(a summary in some other wording)",
        detail=ModelCalledDetail(input_tokens=120, output_tokens=7, cost_usd=0.0012, model="m", tool_calls=1, chars=0),
    )
    line = render(event("run.model_called", ev.model_dump(mode="json")))
    assert line == "[it 2] model: 1 tool call(s), 0 chars · tokens in 120 out 7 · $0.0012"


def test_the_calls_of_a_model_turn_are_shown_under_it() -> None:
    detail = ModelCalledDetail(
        input_tokens=1,
        output_tokens=1,
        cost_usd=0.0,
        model="m",
        tool_calls=2,
        calls=[
            RequestedCall(tool="search", call_id="c1", arguments='{"q": "news"}'),
            RequestedCall(tool="calculator", call_id="c2", arguments='{"expression": "1+2"}'),
        ],
    )
    ev = ModelCalled(run_id="r1", iteration=3, summary="x", detail=detail)
    lines = str(render(event("run.model_called", ev.model_dump(mode="json")))).splitlines()
    assert lines[1:] == ['[it 3] → search({"q": "news"})', '[it 3] → calculator({"expression": "1+2"})']


def test_a_validated_result_is_shown_from_the_validators_event_once() -> None:
    outcome = ToolOutcome(
        run_id="r1",
        iteration=2,
        call_id="c1",
        attempt_id="a1",
        tool="search",
        requested_tool="search",
        success=True,
        repaired=True,
    )
    line = render(event("tool.succeeded.search", outcome.model_dump(mode="json")))
    assert line == "[it 2] ✓ search validated (output repaired)"
    # an older planner also published run.tool_succeeded for it: not shown a second time
    old = ToolSucceeded(
        run_id="r1", iteration=2, summary="search ok", detail=ToolSucceededDetail(tool="search", call_id="c1")
    )
    assert render(event("run.tool_succeeded", old.model_dump(mode="json"))) is None


def test_a_result_whose_body_is_only_a_reference_still_gets_its_line() -> None:
    # a large result travels by reference; when its body cannot be fetched the event is the reference
    reference = {"name": "sha256-ab", "size": 3_000_000, "sha256": "ab"}
    assert render(event("tool.succeeded.bulk_report", reference)) == "       ✓ bulk_report validated"
    assert render(event("tool.attempt.bulk_report", reference)) == "       ↻ bulk_report: an attempt failed"


def test_the_start_line_shows_the_task_from_its_field() -> None:
    ev = Started(run_id="r1", iteration=1, summary="x", detail=StartedDetail(task="What is new?", answer_mode="text"))
    assert render(event("run.started", ev.model_dump(mode="json"))) == "▶ run started (text mode): What is new?"


def test_a_decision_and_a_budget_threshold_are_shown() -> None:
    decided = Decided(
        run_id="r1", iteration=1, summary="row 7: complete", detail=DecidedDetail(action="complete", row=7)
    )
    assert render(event("run.decided", decided.model_dump(mode="json"))) == "[it 1] ⇒ decide row 7: complete"
    budget = {
        "run_id": "r1",
        "kind": "budget.warn",
        "summary": "80% used",
        "detail": BudgetDecision(run_id="r1", turn=1, action="warn", model="m", max_output_tokens=100).model_dump(
            mode="json"
        ),
    }
    assert render(event("budget.warn", budget)) == "       $ budget warn: 80% used"


def test_an_event_kind_this_version_does_not_know_is_not_shown_and_does_not_break_the_watch() -> None:
    assert render(event("run.teleported", {"run_id": "r1", "kind": "teleported", "detail": {}})) is None


def test_a_wait_for_the_rate_limit_is_shown_with_how_long_and_why() -> None:
    until = datetime(2026, 3, 1, 12, 0, 3, tzinfo=UTC)
    ev = RateLimited(
        run_id="r1",
        iteration=2,
        summary="(a summary in some other wording)",
        detail=RateLimitedDetail(
            provider="anthropic", account="0123456789ab", purpose="plan", wait_s=3.4, until=until, reason="paused"
        ),
    )
    line = render(event("run.rate_limited", ev.model_dump(mode="json")))
    local = until.astimezone().strftime("%H:%M:%S")
    assert line == (
        f"[it 2] ⏳ waiting for the rate limit: 3.4s until {local} "
        "(plan call, anthropic key 0123456789ab, paused by a 429)"
    )
