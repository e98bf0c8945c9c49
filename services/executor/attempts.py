"""A call's attempts: the executor is the *one* layer that retries transient tool failures (the delay
from ``recovery.retry_delay``); when retries are spent, what ``recovery.after_retries`` chose is carried
out (fallback, cached result, failure). Each attempt runs the call's tool function (the hosted tool, or
what the handler chose once to stand around it for this call), under its timeout, then its post-call hook."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, assert_never

from opentelemetry.metrics import Histogram
from opentelemetry.trace import Status, StatusCode, Tracer

from services.executor import ids
from services.executor.finishing import Finisher
from services.executor.ledger import LedgerEntry
from services.executor.ownership import Ownership
from services.executor.recovery import Attempted, Fail, Fallback, UseCached, model_error, retry_delay
from services.executor.recovery import after_retries as recovery_after
from services.executor.registry import HostedTool
from shared import subjects as S
from shared import telemetry as T
from shared.bus import Bus
from shared.call_identity import CallIdentity
from shared.canonical import cache_key
from shared.messages import CachedToolResult, ToolCall, ToolResultRaw
from shared.metrics import Tally
from shared.settings import FaultPoint, Settings
from shared.tools import ToolContext, ToolFailure, ToolFn

log = logging.getLogger("loopwarden.executor")

Around = Callable[[ToolFn], ToolFn]  # what a call runs in place of its tool, given the tool (chosen once per call)


def raw_result(call: ToolCall, output: Any, attempts: int, **extra: Any) -> ToolResultRaw:
    """What the validator checks: a call's output with where it came from."""
    return CallIdentity.of(call).raw(output, attempts, **extra)


class Reached:
    """The hosted tool as an attempt runs it: whether it was reached (cut off after that, it may have done
    its work), and the fault point right after its side effect."""

    def __init__(self, fn: ToolFn, fault: Callable[[FaultPoint], None]) -> None:
        self.fn, self.fault, self.reached = fn, fault, False

    async def __call__(self, args: dict[str, Any], ctx: ToolContext) -> Any:
        self.reached = True
        output = await self.fn(args, ctx)
        self.fault("after_side_effect")
        return output


class Attempts:
    """Runs a claimed call until it ends: under ``ownership``'s lease, ended by ``finisher``."""

    def __init__(
        self,
        bus: Bus,
        settings: Settings,
        tracer: Tracer,
        attempts: Tally,
        fault: Callable[[FaultPoint], None],
        ownership: Ownership,
        finisher: Finisher,
        durations: Histogram | None = None,
    ) -> None:
        self.bus, self.settings, self.tracer, self.attempts, self.fault = bus, settings, tracer, attempts, fault
        self.ownership, self.finisher = ownership, finisher
        self.durations = durations  # loopwarden.tool.duration: each attempt, by tool and result

    async def run_attempts(
        self,
        call: ToolCall,
        hosted: HostedTool,
        entry: LedgerEntry,
        revision: int,
        stripped: list[str],
        around: Around | None = None,
    ) -> None:
        """Run the call (``stripped``: the undeclared input fields removed before it, for its result to say;
        ``around``: what runs in place of the tool for this call, chosen once by the handler)."""
        lease = asyncio.create_task(self.ownership.keep_lease(entry, revision)) if revision else None
        try:
            await self.attempts_of(call, hosted, entry, revision, stripped, around)
        finally:
            if lease is not None:
                lease.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await lease

    async def attempts_of(
        self,
        call: ToolCall,
        hosted: HostedTool,
        entry: LedgerEntry,
        revision: int,
        stripped: list[str],
        around: Around | None = None,
    ) -> None:
        contract = hosted.contract
        tool = Reached(hosted.fn, self.fault)
        run = tool if around is None else around(tool)  # once per call
        started = time.monotonic()
        n = 0
        while True:
            n += 1
            with self.tracer.start_as_current_span(
                f"tool attempt {call.tool}",
                attributes={T.GEN_AI_TOOL_NAME: call.tool, T.LW_ATTEMPT: n, T.LW_RUN_ID: call.run_id},
            ) as span:
                began = time.monotonic()
                result = await self.attempt(call, hosted, run, tool, n)
                took = time.monotonic() - began
                delay = retry_delay(contract, result, n, time.monotonic() - started)
                if not result.ok:
                    span.set_attribute(T.LW_FAILURE_TYPE, result.failure_type or "")
                    span.set_status(Status(StatusCode.ERROR, result.error or ""))
                if delay is not None:
                    span.set_attribute(T.LW_BACKOFF_S, round(delay, 4))
                tried = {"tool": call.tool, "result": "ok" if result.ok else result.failure_type or ""}
                self.attempts.add(1, tried)
                if self.durations is not None:
                    self.durations.record(took, tried)
                if not result.ok:  # a successful attempt is told by the call's outcome (its ``attempts``)
                    await self.bus.publish(
                        S.tool_attempt(call.tool),
                        CallIdentity.of(call).attempt_failed(n, result.failure_type, result.error, delay),
                        msg_id=ids.attempt_failed(call.attempt_id, entry.runs, n),
                    )
            if result.ok:
                raw = raw_result(
                    call,
                    result.output,
                    n,
                    output_is_text=result.output_is_text,
                    duration_ms=round((time.monotonic() - started) * 1000, 2),
                    stripped=stripped,
                )
                await self.finisher.finish_result(call, hosted, entry, revision, raw)
                return
            if delay is None:
                break
            await self.interim_failure(call, entry, result, n)
            await asyncio.sleep(delay)
        await self.after_retries(call, hosted, entry, revision, result, n, stripped)

    async def interim_failure(self, call: ToolCall, entry: LedgerEntry, result: Attempted, n: int) -> None:
        """A transient failure the executor goes on from (retry, fallback, cached result): published like
        every failure, so subscribers and the failures metric see it, marked ``will_retry``."""
        ftype = result.failure_type or "transient"
        outcome = self.finisher.outcome(
            call,
            ftype,
            model_error(call.tool, ftype, result.error or ftype, n),
            recoverable=True,
            attempts=n,
            will_retry=True,
        )
        await self.bus.publish(
            S.failure(ftype, call.tool), outcome, msg_id=ids.retrying(call.attempt_id, entry.runs, n)
        )

    async def after_retries(
        self,
        call: ToolCall,
        hosted: HostedTool,
        entry: LedgerEntry,
        revision: int,
        result: Attempted,
        attempts: int,
        stripped: list[str],
    ) -> None:
        """Carry out what the recovery policy chose for a call whose last attempt failed."""
        step = recovery_after(hosted.contract, call, result, attempts)
        match step:
            case Fallback(call=fallback):
                await self.interim_failure(call, entry, result, attempts)
                await self.finisher.finish(
                    call, entry, revision, S.tool_execute(fallback.tool), fallback, f"{fallback.attempt_id}.call"
                )
                return
            case UseCached(otherwise=fail):
                cached, _ = await self.bus.kv_get(
                    S.KV_TOOL_CACHE, cache_key(call.tool, call.arguments), CachedToolResult
                )
                if cached is not None:
                    await self.interim_failure(call, entry, result, attempts)
                    raw = raw_result(call, cached.data, attempts, cached=True, stripped=stripped)
                    await self.finisher.finish_result(call, hosted, entry, revision, raw)
                    return
            case Fail():
                fail = step
            case _:
                assert_never(step)
        await self.finisher.finish_failure(
            call,
            entry,
            revision,
            fail.failure_type,
            fail.detail,
            recoverable=fail.recoverable,
            boundary=fail.boundary,
            attempts=attempts,
            effect=fail.effect,
        )

    async def attempt(self, call: ToolCall, hosted: HostedTool, run: ToolFn, tool: Reached, n: int) -> Attempted:
        """One execution of the call's tool function, under the tool's timeout."""
        contract = hosted.contract
        ctx = ToolContext(run_id=call.run_id, call_id=call.call_id, attempt=n, buckets=self.bus.kv)
        tool.reached = False
        try:
            async with asyncio.timeout(contract.timeout_s):
                return self.hooked(hosted, await run(call.arguments, ctx))
        except TimeoutError:
            return Attempted(
                False,
                failure_type="timeout",
                error=f"no answer within {contract.timeout_s:g}s",
                effect_unknown=tool.reached,
            )
        except ToolFailure as failure:
            return Attempted(
                False,
                failure_type=failure.kind,
                error=str(failure),
                retry_after_s=failure.retry_after_s,
                effect=failure.effect,
            )
        except Exception as err:  # a bug in the tool: not something a retry fixes
            log.exception("tool %s crashed", call.tool)
            return Attempted(False, failure_type="fatal", error=f"the tool crashed: {err!r}")

    @staticmethod
    def hooked(hosted: HostedTool, output: Any) -> Attempted:
        """Apply the tool's post-call hook; validation happens after it, in the validator."""
        if hosted.post_hook is not None:
            try:
                output = hosted.post_hook(output)
            except Exception as err:
                return Attempted(False, failure_type="fatal", error=f"the post-call hook failed: {err!r}")
        return Attempted(True, output=output, output_is_text=isinstance(output, str) and not hosted.text_result)
