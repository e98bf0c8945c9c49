"""The tool metrics count a call's attempts from its final outcome (``attempts``) and its
``tool.attempt`` events (the failed attempts; an earlier executor published the successful one
too), whichever says more: the same count from streams of either version."""

from __future__ import annotations

from typing import Any

from loopwarden.client import Event, tool_metrics
from shared.messages import ToolAttempt, ToolOutcome


def attempt(aid: str, n: int, ok: bool = False, retry: bool = True) -> Event:
    a = ToolAttempt(
        run_id="r1", call_id=aid, attempt_id=aid, tool="search", attempt=n, ok=ok, next_delay_s=0.1 if retry else None
    )
    return Event(subject="lw.v1.evt.tool.attempt.search.r1", payload=a.model_dump(mode="json"), run_id="r1")


def outcome(aid: str, subject: str, tool: str = "search", **fields: Any) -> Event:
    o = ToolOutcome.model_validate(
        {"run_id": "r1", "iteration": 1, "call_id": aid, "attempt_id": aid, "tool": tool, "requested_tool": tool}
        | {"success": True}
        | fields
    )
    return Event(subject=f"lw.v1.evt.{subject}.r1", payload=o.model_dump(mode="json", by_alias=True), run_id="r1")


def test_two_failed_attempts_then_a_success_are_three_attempts_in_either_version() -> None:
    new = [attempt("a", 1), attempt("a", 2), outcome("a", "tool.succeeded.search", attempts=3)]
    old = [*new[:2], attempt("a", 3, ok=True, retry=False), new[2]]
    for events in (new, old):
        m = tool_metrics(events)["search"]
        assert (m["attempts"], m["retried_attempts"]) == (3, 2)


def test_an_output_that_could_not_be_sent_counts_the_attempt_that_returned_it() -> None:
    fatal = outcome("a", "failure.fatal.search", success=False, failure_type="fatal", error="not JSON", attempts=1)
    assert tool_metrics([fatal])["search"]["attempts"] == 1


def test_a_fallback_counts_the_primary_attempts_and_its_own() -> None:
    interim = outcome("a", "failure.transient.search", success=False, failure_type="transient", error="503", attempts=2)
    interim.payload["will_retry"] = True  # the executor goes on with the fallback: not the call's outcome
    events = [attempt("a", 1), attempt("a", 2, retry=False), interim]
    events.append(outcome("a.fb.cache", "tool.succeeded.cache", tool="cache", attempts=1))
    m = tool_metrics(events)
    assert m["search"]["attempts"] == 2 and m["cache"]["attempts"] == 1


def test_a_sub_agents_answer_and_refused_arguments_are_no_attempts() -> None:
    delegated = outcome("child-run", "tool.succeeded.delegate", tool="delegate", attempts=0)
    refused = outcome(
        "b", "failure.input_invalid.search", success=False, failure_type="input_invalid", error="bad", attempts=0
    )
    m = tool_metrics([delegated, refused])
    assert m["delegate"]["attempts"] == 0 and m["search"]["attempts"] == 0
