"""The executor's recovery policy (pure): after each attempt, retry or not; after the last one,
fall back to another tool, stand in with the cached result, or fail (with the tool's boundary).

Beside ``ledger.on_delivery`` (what a delivery must do) this is the other rule of the executor; the
handler keeps only the I/O: the ledger, publishing, sleeping and the span.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from shared.backoff import BackoffPolicy, next_delay
from shared.call_identity import CallIdentity
from shared.failures import FAILURES, FailureType, tells
from shared.messages import Boundary, FallbackNote, ToolCall, ToolContract

MAX_FALLBACK_DEPTH = 3


@dataclass
class Attempted:
    """What one execution of a tool did."""

    ok: bool
    output: Any = None
    output_is_text: bool = False
    failure_type: FailureType | None = None
    error: str | None = None
    retry_after_s: float | None = None
    effect_unknown: bool = False  # the real tool was cut off (timeout): it may have done its work
    effect: str | None = None  # ToolFailure.effect (MCP tools)


@dataclass(frozen=True)
class Fail:
    """The call's final outcome is this failure."""

    failure_type: FailureType
    detail: str
    recoverable: bool = False
    boundary: Boundary | None = None
    effect: str | None = None  # for a non-idempotent tool: whether its side effect happened (MCP)


@dataclass(frozen=True)
class Fallback:
    """Run ``call`` (the fallback tool, with a note saying why) in place of the failed one."""

    call: ToolCall


@dataclass(frozen=True)
class UseCached:
    """Stand in with the last good result for the same arguments; ``otherwise`` when there is none."""

    otherwise: Fail


Recovery = Fallback | UseCached | Fail


def backoff_policy(contract: ToolContract) -> BackoffPolicy:
    r = contract.retry
    return BackoffPolicy(r.max_attempts, r.base_delay_s, r.max_delay_s, r.max_elapsed_s)


def retry_delay(
    contract: ToolContract, result: Attempted, attempt: int, elapsed_s: float, rng: random.Random | None = None
) -> float | None:
    """Seconds to wait before attempt ``attempt + 1``, or None: no more attempts."""
    if result.ok or result.failure_type is None or not FAILURES[result.failure_type].retried:
        return None
    if result.effect_unknown and not contract.idempotent:
        return None  # a non-idempotent tool cut off mid-call may have done its work: never run it again
    return next_delay(backoff_policy(contract), attempt, elapsed_s, result.retry_after_s, rng)


def after_retries(contract: ToolContract, call: ToolCall, result: Attempted, attempts: int) -> Recovery:
    """What a call whose last attempt failed turns into."""
    ftype: FailureType = result.failure_type or "fatal"
    if result.effect_unknown and not contract.idempotent:
        return Fail("unknown_outcome", f"it was cut off ({result.error or ftype}) and may have done its work")
    # A fallback or a cached result stands in only for a tool that could not be reached; a
    # tool_error (MCP isError) is the tool's own answer: the model reads it and can correct it.
    rule = FAILURES[ftype]
    fallback = contract.fallback
    if (
        rule.stands_in
        and fallback
        and call.attempt_id.count(".fb.") < MAX_FALLBACK_DEPTH
        and f".fb.{fallback}" not in call.attempt_id
        and fallback != call.requested_tool
    ):
        note = FallbackNote(
            from_tool=call.tool, to_tool=fallback, reason=model_error(call.tool, ftype, result.error or ftype, attempts)
        )
        return Fallback(CallIdentity.of(call).as_fallback(fallback, note).call())
    fail = Fail(
        ftype,
        result.error or ftype,
        recoverable=rule.recoverable,
        boundary=contract.boundary if rule.boundary else None,
        effect=result.effect,
    )
    if rule.stands_in and contract.boundary == "use_cached":
        return UseCached(otherwise=fail)
    return fail


def model_error(tool: str, failure_type: FailureType, detail: str, attempts: int) -> str:
    """Failures written for the model: what happened and what it can do next (the failure table's words)."""
    return tells(tool, failure_type, detail, attempts)
