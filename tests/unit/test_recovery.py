"""The executor's recovery policy as a table: retry, then fallback, cached result or failure."""

from __future__ import annotations

import random
from typing import Any

import pytest

from services.executor.recovery import (
    MAX_FALLBACK_DEPTH,
    Attempted,
    Fail,
    Fallback,
    Recovery,
    UseCached,
    after_retries,
    retry_delay,
)
from shared.messages import RetryPolicy, ToolCall, ToolContract


def contract(**fields: Any) -> ToolContract:
    schema = {"type": "object"}
    return ToolContract(name="search", description="search", inputSchema=schema, outputSchema=schema, **fields)


def call(attempt_id: str = "r1.i1.c1", requested: str = "search") -> ToolCall:
    return ToolCall(
        run_id="r1",
        iteration=1,
        call_id="c1",
        attempt_id=attempt_id,
        tool="search",
        requested_tool=requested,
        arguments={"q": "x"},
    )


def failed(ftype: Any, effect_unknown: bool = False, **extra: Any) -> Attempted:
    return Attempted(False, failure_type=ftype, error="HTTP 503", effect_unknown=effect_unknown, **extra)


RETRY = RetryPolicy(max_attempts=3, base_delay_s=0.1, max_delay_s=1.0, max_elapsed_s=30)


@pytest.mark.parametrize(
    ("result", "idempotent", "attempt", "retried"),
    [
        (failed("transient"), False, 1, True),  # reachable again: retried
        (failed("timeout"), True, 2, True),
        (failed("timeout", effect_unknown=True), True, 1, True),  # cut off, but safe to repeat
        (failed("timeout", effect_unknown=True), False, 1, False),  # cut off and may have done its work
        (failed("transient"), True, 3, False),  # the attempts are spent
        (failed("fatal"), True, 1, False),  # a retry does not fix these
        (failed("tool_error"), True, 1, False),
        (failed("input_invalid"), True, 1, False),
        (Attempted(True, output={}), True, 1, False),
    ],
)
def test_only_reachability_failures_are_retried_and_only_when_safe(
    result: Attempted, idempotent: bool, attempt: int, retried: bool
) -> None:
    delay = retry_delay(contract(idempotent=idempotent, retry=RETRY), result, attempt, 0.0, random.Random(1))
    assert (delay is not None) is retried


def test_a_retry_waits_at_least_what_the_server_asked() -> None:
    delay = retry_delay(contract(retry=RETRY), failed("transient", retry_after_s=0.75), 1, 0.0, random.Random(1))
    assert delay is not None and delay >= 0.75


@pytest.mark.parametrize(
    ("spec", "the_call", "result", "expected"),
    [
        # a non-idempotent tool cut off mid-call: a human decides, nothing stands in for it
        (
            {"fallback": "lookup", "boundary": "use_cached"},
            call(),
            failed("timeout", effect_unknown=True),
            Fail("unknown_outcome", "it was cut off (HTTP 503) and may have done its work"),
        ),
        # unreachable with a fallback: the fallback runs, noted
        ({"fallback": "lookup"}, call(), failed("transient"), Fallback),
        # the fallback chain does not come back to a tool it passed through, nor grow without bound
        ({"fallback": "lookup"}, call("r1.i1.c1.fb.lookup"), failed("transient"), Fail),
        ({"fallback": "lookup"}, call(requested="lookup"), failed("transient"), Fail),
        ({"fallback": "lookup"}, call("a" + ".fb.x" * MAX_FALLBACK_DEPTH), failed("transient"), Fail),
        # unreachable, no fallback, cache allowed: the cached result, else the failure
        (
            {"boundary": "use_cached"},
            call(),
            failed("timeout"),
            UseCached(Fail("timeout", "HTTP 503", recoverable=True, boundary="use_cached")),
        ),
        # the tool's own error answer: the model reads it, nothing stands in, no boundary
        (
            {"fallback": "lookup", "boundary": "ask_human"},
            call(),
            failed("tool_error"),
            Fail("tool_error", "HTTP 503", recoverable=True),
        ),
        # spent retries end at the tool's boundary
        (
            {"boundary": "skip_and_note"},
            call(),
            failed("transient"),
            Fail("transient", "HTTP 503", recoverable=True, boundary="skip_and_note"),
        ),
        ({"boundary": "ask_human"}, call(), failed("fatal"), Fail("fatal", "HTTP 503", boundary="ask_human")),
    ],
)
def test_after_the_last_attempt_the_policy_picks_fallback_cache_or_failure(
    spec: dict[str, Any], the_call: ToolCall, result: Attempted, expected: Recovery | type
) -> None:
    got = after_retries(contract(**spec), the_call, result, 3)
    if isinstance(expected, type):
        assert isinstance(got, expected), got
    else:
        assert got == expected


def test_a_fallback_call_says_where_it_came_from_and_why() -> None:
    got = after_retries(contract(fallback="lookup"), call(), failed("transient"), 3)
    assert isinstance(got, Fallback)
    assert got.call.tool == "lookup" and got.call.attempt_id == "r1.i1.c1.fb.lookup"
    assert got.call.fallback_from is not None and got.call.fallback_from.from_tool == "search"
    assert "temporarily unavailable (HTTP 503) after 3 attempt(s)" in got.call.fallback_from.reason


def test_an_mcp_failure_keeps_what_it_said_about_its_side_effect() -> None:
    got = after_retries(contract(), call(), failed("unknown_outcome", effect="may_have"), 1)
    assert got == Fail("unknown_outcome", "HTTP 503", effect="may_have")
