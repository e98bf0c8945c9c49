"""A call's attempts: the executor is the *one* layer that retries transient tool failures (the delay
from ``recovery.retry_delay``); when retries are spent, what ``recovery.after_retries`` chose is carried
out (fallback, cached result, failure). Each attempt runs the scripted behaviour (scripted runs only) or
the real tool, under its timeout, then its post-call hook."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, assert_never

from opentelemetry.metrics import Counter, Histogram
from opentelemetry.trace import Status, StatusCode, Tracer

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
from shared.messages import CachedToolResult, ToolCall, ToolResultRaw, Wire
from shared.providers.select import scripted_tools
from shared.scenario import ToolBehaviour
from shared.settings import FaultPoint, Settings
from shared.tools import ToolContext, ToolFailure

log = logging.getLogger("loopwarden.executor")


class Cursor(Wire):
    next: int = 0


def raw_result(call: ToolCall, output: Any, attempts: int, **extra: Any) -> ToolResultRaw:
    """What the validator checks: a call's output with where it came from."""
    return CallIdentity.of(call).raw(output, attempts, **extra)


class Attempts:
    """Runs a claimed call until it ends: under ``ownership``'s lease, ended by ``finisher``."""

    def __init__(
        self,
        bus: Bus,
        settings: Settings,
        tracer: Tracer,
        attempts: Counter,
        fault: Callable[[FaultPoint], None],
        ownership: Ownership,
        finisher: Finisher,
        durations: Histogram | None = None,
    ) -> None:
        self.bus, self.settings, self.tracer, self.attempts, self.fault = bus, settings, tracer, attempts, fault
        self.ownership, self.finisher = ownership, finisher
        self.durations = durations  # loopwarden.tool.duration: each attempt, by tool and result

    async def run_attempts(
        self, call: ToolCall, hosted: HostedTool, entry: LedgerEntry, revision: int, stripped: list[str]
    ) -> None:
        """Run the call (``stripped``: the undeclared input fields removed before it, for its result to say)."""
        lease = asyncio.create_task(self.ownership.keep_lease(entry, revision)) if revision else None
        try:
            await self.attempts_of(call, hosted, entry, revision, stripped)
        finally:
            if lease is not None:
                lease.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await lease

    async def attempts_of(
        self, call: ToolCall, hosted: HostedTool, entry: LedgerEntry, revision: int, stripped: list[str]
    ) -> None:
        contract = hosted.contract
        started = time.monotonic()
        n = 0
        while True:
            n += 1
            with self.tracer.start_as_current_span(
                f"tool attempt {call.tool}",
                attributes={T.GEN_AI_TOOL_NAME: call.tool, T.LW_ATTEMPT: n, T.LW_RUN_ID: call.run_id},
            ) as span:
                began = time.monotonic()
                result = await self.attempt(call, hosted, n)
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
                        msg_id=f"{call.attempt_id}.attempt.{entry.runs}.{n}",
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
            S.failure(ftype, call.tool), outcome, msg_id=f"{call.attempt_id}.failure.{entry.runs}.{n}"
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

    async def attempt(self, call: ToolCall, hosted: HostedTool, n: int) -> Attempted:
        """One execution: the scripted behaviour for this attempt (scripted runs only), else the real tool,
        under its timeout."""
        contract = hosted.contract
        behaviour = await self.scripted(call)
        ctx = ToolContext(run_id=call.run_id, call_id=call.call_id, attempt=n, buckets=self.bus.kv)
        real_tool_started = False
        try:
            async with asyncio.timeout(contract.timeout_s):
                if behaviour is not None and not behaviour.runs_real_tool:
                    await asyncio.sleep(behaviour.latency_s)
                    if behaviour.fail is not None:
                        detail = behaviour.error or f"scripted {behaviour.fail} failure"
                        if behaviour.fail == "timeout":
                            return Attempted(False, failure_type="timeout", error=detail)
                        return Attempted(
                            False, failure_type=behaviour.fail, error=detail, retry_after_s=behaviour.retry_after_s
                        )
                    if behaviour.output_text is not None:
                        return self.hooked(hosted, behaviour.output_text)
                    return self.hooked(hosted, behaviour.output)
                real_tool_started = True
                output = await hosted.fn(call.arguments, ctx)
                self.fault("after_side_effect")
                if behaviour is not None and behaviour.latency_s:
                    await asyncio.sleep(behaviour.latency_s)  # e.g. a slow response after the effect happened
                return self.hooked(hosted, output)
        except TimeoutError:
            return Attempted(
                False,
                failure_type="timeout",
                error=f"no answer within {contract.timeout_s:g}s",
                effect_unknown=real_tool_started,
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

    async def scripted(self, call: ToolCall) -> ToolBehaviour | None:
        """Scripted tool behaviour: only for a run submitted with a scenario (the provider registry says which);
        a live run never consults one."""
        scenario = await scripted_tools(self.bus, self.settings, call.run_id)
        if scenario is None or call.tool not in scenario.tools:
            return None

        def take(cursor: Cursor | None) -> tuple[Cursor, int]:  # the n-th attempt of this tool in this run
            index = cursor.next if cursor else 0
            return Cursor(next=index + 1), index

        index = await self.bus.update(S.KV_SCRIPT_CURSORS, S.kv_key(call.run_id, call.tool), Cursor, take)
        return scenario.tool_behaviour(call.tool, index)
