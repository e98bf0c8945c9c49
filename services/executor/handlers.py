"""Executor bus handlers: validate arguments, run the tool exactly as often as is safe.

The executor is the *one* layer that retries transient tool failures (exponential backoff,
full jitter, Retry-After, bounded by attempts and elapsed time, per-tool policy). A
schema failure is never retried here. When retries are spent on a recoverable failure:
the tool's fallback runs (through the bus, so another executor may host it), else its
boundary applies (``use_cached`` here; ``skip_and_note`` and ``ask_human`` in the planner).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from datetime import datetime, timedelta
from typing import Any, assert_never

from nats.errors import MaxPayloadError
from nats.js.errors import APIError
from opentelemetry.trace import Span, Status, StatusCode
from pydantic_core import PydanticSerializationError

from services.executor.ledger import (
    FinalPublish,
    LedgerEntry,
    claim,
    lease_live,
    on_delivery,
    on_final_conflict,
    renewed,
)
from services.executor.recovery import Attempted, Fail, Fallback, UseCached, model_error, retry_delay
from services.executor.recovery import after_retries as recovery_after
from services.executor.registry import HostedTool, ToolContext, ToolFailure, ToolRegistry
from shared import subjects as S
from shared import telemetry as T
from shared.bus import Bus, CasConflict, TryLater, current_deliveries
from shared.canonical import cache_key
from shared.contracts.registration import validator_for
from shared.contracts.undeclared import admit
from shared.contracts.validation import format_for_model
from shared.failures import FailureType
from shared.messages import (
    CachedToolResult,
    DeadLetter,
    McpServerStatus,
    SchemaError,
    ToolAttempt,
    ToolCall,
    ToolOutcome,
    ToolResultRaw,
    Wire,
    utcnow,
)
from shared.providers.select import scripted_tools
from shared.scenario import ToolBehaviour
from shared.settings import FaultPoint, Settings

log = logging.getLogger("loopwarden.executor")


class Cursor(Wire):
    next: int = 0


def raw_result(call: ToolCall, output: Any, attempts: int, **extra: Any) -> ToolResultRaw:
    """What the validator checks: a call's output with where it came from."""
    return ToolResultRaw(
        run_id=call.run_id,
        iteration=call.iteration,
        call_id=call.call_id,
        attempt_id=call.attempt_id,
        tool=call.tool,
        requested_tool=call.requested_tool,
        arguments=call.arguments,
        output=output,
        attempts=attempts,
        fallback_from=call.fallback_from,
        **extra,
    )


class Executor:
    def __init__(self, bus: Bus, settings: Settings, telemetry: T.Telemetry, registry: ToolRegistry) -> None:
        self.bus, self.settings, self.registry = bus, settings, registry
        self.tracer = telemetry.tracer("loopwarden.executor")
        meter = telemetry.meter("loopwarden.executor")
        self.attempts = meter.create_counter("loopwarden.tool.attempts", description="tool attempts by result")
        self.undeclared = meter.create_counter(
            "loopwarden.tool.undeclared_fields", description="tool calls that carried undeclared input fields"
        )
        self._consuming: set[str] = set()
        self.mounts: list[Any] = []
        self._hosting: set[asyncio.Task[None]] = set()  # tools of late MCP servers being hosted
        self.fault_point: FaultPoint | None = settings.fault_inject  # read once, at start
        # This replica, as the owner a ledger entry names (a restarted process is another owner).
        self.replica = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        # attempt id -> (ledger revision, when this replica first saw it): how long an entry whose owner's
        # lease lapsed has stayed as it is, seen from here (``ledger.on_delivery``).
        self._seen: dict[str, tuple[int, float]] = {}
        if self.fault_point is not None:
            log.warning("TEST FAULT INJECTION: this executor exits at %s of every tool call", self.fault_point)

    def register(self) -> None:
        for name in sorted(self.registry.hosted(self.settings.hosted_tools)):
            if name in self._consuming:
                continue
            self._consuming.add(name)
            self.bus.consumer(
                durable=S.executor_durable(name),
                filter_subjects=[S.tool_execute(name)],
                model=ToolCall,
                requeue_scope=name,  # replicas may host different tools: a letter goes back to one hosting its tool
            )(self.handler_for(name))

    def handler_for(self, tool: str) -> Any:
        """The handler of ``tool``'s subject: it runs that tool and no other (the subject is the boundary
        that per-tool permissions and consumers draw)."""

        async def on_call(call: ToolCall) -> None:
            await self.on_call(call, tool)

        on_call.__name__ = f"on_call_{S.token(tool)}"
        return on_call

    async def start(self) -> None:
        """After connecting: mount MCP servers, consume their tools too, publish every contract."""
        specs = self.settings.mcp_server_specs
        if specs:
            from services.executor.mcp_tools import McpMount, close_all, host, mount_mcp_servers

            async def on_status(status: McpServerStatus) -> None:  # event + status per server (issue 14)
                await self.bus.publish(S.mcp_server_event(status.server), status)
                await self.bus.kv_put(S.KV_MCP_SERVERS, S.kv_key(status.server, status.executor), status)

            async def on_late_up(mount: McpMount) -> None:  # failed at start, up now: host its tools live
                added = host(mount, self.registry)
                log.info("MCP server '%s' came up late: hosting %s", mount.spec.name, ", ".join(added) or "-")
                # In the background: with managed infrastructure the new durables may still be waited
                # for, and the server's supervisor must go on watching it meanwhile.
                task = asyncio.create_task(self.host_tools())
                self._hosting.add(task)
                task.add_done_callback(self._hosting.discard)

            self.mounts = await mount_mcp_servers(self.registry, specs, on_status, on_late_up)
            self.bus.on_stop.append(lambda: close_all(self.mounts))
        await self.host_tools()

    async def host_tools(self) -> None:
        """Consume every registered tool's subject (tools mounted after start included) and publish
        the contracts."""
        self.register()
        await self.bus.reconcile_consumers()
        await self.publish_contracts()

    async def publish_contracts(self) -> None:
        """Make this executor's contracts visible to the planner and the validator."""
        for name, hosted in self.registry.hosted(self.settings.hosted_tools).items():
            await self.bus.kv_put(S.KV_CONTRACTS, S.kv_key(name), hosted.contract)
        for name, reason in self.registry.refused.items():
            log.error("tool %s is not available: %s", name, reason)

    def fault(self, point: FaultPoint) -> None:
        """Test-only fault injection: die here, as a SIGKILL would, when this point is configured."""
        if self.fault_point == point:
            log.error("TEST FAULT INJECTION: exiting at %s", point)
            logging.shutdown()
            os._exit(70)

    # --- the handler ------------------------------------------------------------------------------
    async def on_call(self, call: ToolCall, subject_tool: str | None = None) -> None:
        subject_tool = subject_tool or call.tool
        if call.tool != subject_tool:
            await self.refuse(call, subject_tool)
            return
        hosted = self.registry.tools[subject_tool]
        contract = hosted.contract
        with self.tracer.start_as_current_span(
            f"execute_tool {call.tool}",
            attributes={
                T.GEN_AI_OPERATION_NAME: T.OP_EXECUTE_TOOL,
                T.GEN_AI_TOOL_NAME: call.tool,
                T.GEN_AI_TOOL_CALL_ID: call.call_id,
                T.GEN_AI_TOOL_TYPE: "function",
                T.GEN_AI_TOOL_DESCRIPTION: contract.description[:256],
                T.LW_RUN_ID: call.run_id,
            },
        ) as span:
            admitted = admit(
                validator_for(contract, "input"), contract.input_schema, call.arguments, self.settings.undeclared_fields
            )
            errors = admitted.errors
            stripped = admitted.undeclared if admitted.outcome == "stripped" else []  # said in the outcome
            if admitted.undeclared:  # counted whatever the policy: how often the model invents fields, per tool
                self.undeclared.add(1, {"tool": call.tool, "policy": admitted.policy, "outcome": admitted.outcome})
                span.set_attribute(T.LW_UNDECLARED_FIELDS, admitted.undeclared)
                span.set_attribute(T.LW_UNDECLARED_OUTCOME, admitted.outcome)
                call = call.model_copy(update={"arguments": admitted.arguments})
            if errors:
                span.set_attribute(T.LW_FAILURE_TYPE, "input_invalid")
                span.set_attribute(T.ERROR_TYPE, "input_invalid")
                await self.fail(
                    call,
                    "input_invalid",
                    f"the arguments for '{call.tool}' break its input schema:\n{format_for_model(errors)}",
                    recoverable=True,
                    errors=errors,
                    schema=contract.input_schema,
                    attempts=0,
                )
                return

            delivery = current_deliveries()
            entry = claim(None, call.attempt_id, call.tool, contract.idempotent, delivery, **self.lease())
            revision = 0
            if not (contract.idempotent and delivery == 1):
                # A non-idempotent call (or any redelivery) is claimed with a create before the tool
                # runs (one round trip: the common case reads nothing); only a key that exists already
                # is read and decided upon. An idempotent call's first delivery runs at once (running
                # it again is harmless) and records its final with that create (``finish``).
                try:
                    revision = await self.save(entry, 0)  # recorded *before* the tool runs
                except CasConflict:
                    claimed = await self.reclaim(call, contract.idempotent, span)
                    if claimed is None:
                        return
                    entry, revision = claimed
            self.fault("after_start_recorded")
            await self.run_attempts(call, hosted, entry, revision, stripped)
            self.fault("after_final_published")

    async def reclaim(self, call: ToolCall, idempotent: bool, span: Span) -> tuple[LedgerEntry, int] | None:
        """The ledger already holds this call (a redelivery, or a racing delivery's claim): republish its
        recorded final, fail it as an unknown outcome, or claim it again (CAS) to run an idempotent tool
        once more. The claimed entry and its revision, or None when the call is finished here."""
        entry, revision = await self.bus.kv_get(S.KV_TOOL_LEDGER, call.attempt_id, LedgerEntry)
        lease_s = self.settings.tool_lease_s
        unchanged_s = self.unchanged_for(call.attempt_id, revision)
        decision = on_delivery(entry, utcnow(), unchanged_s, lease_s)
        if decision != "wait":
            self._seen.pop(call.attempt_id, None)
        match decision:
            case "wait":
                assert entry is not None
                if lease_live(entry, utcnow()):
                    assert entry.lease_until is not None
                    delay, why = (entry.lease_until - utcnow()).total_seconds(), "is running it"
                else:
                    delay, why = lease_s - unchanged_s, "let its lease lapse (cut off, or gone?)"
                raise TryLater(
                    f"ledger entry {call.attempt_id}: {entry.owner or 'an earlier delivery'} {why}",
                    delay=min(max(delay, 0.2), lease_s),
                )
            case "republish":
                assert entry is not None
                await self.deliver(call, entry, revision)
                return None
            case "unknown_outcome":
                assert entry is not None
                span.set_attribute(T.LW_FAILURE_TYPE, "unknown_outcome")
                await self.finish_failure(
                    call,
                    entry,
                    revision,
                    "unknown_outcome",
                    "a previous delivery started it but no result was recorded",
                    attempts=entry.runs,
                )
                return None
            case "run":
                pass
            case _:
                assert_never(decision)
        entry = claim(entry, call.attempt_id, call.tool, idempotent, **self.lease())
        try:
            revision = await self.save(entry, revision)
        except CasConflict as err:  # another executor claimed it a moment ago: decide again
            raise TryLater(f"ledger entry {call.attempt_id} changed while claiming it", delay=0.5) from err
        return entry, revision

    def lease(self) -> dict[str, Any]:
        """This replica's claim: it owns the entry, for a lease from now."""
        return {"owner": self.replica, "lease_until": renewed_at(self.settings.tool_lease_s)}

    def unchanged_for(self, attempt_id: str, revision: int) -> float:
        """Seconds this replica has seen ``attempt_id``'s ledger entry at ``revision``."""
        now = time.monotonic()
        seen = self._seen.get(attempt_id)
        if seen is None or seen[0] != revision:
            if len(self._seen) >= 10_000:  # decided elsewhere long ago: forget the oldest
                self._seen.pop(next(iter(self._seen)))
            self._seen[attempt_id] = (revision, now)
            return 0.0
        return now - seen[1]

    async def keep_lease(self, entry: LedgerEntry, revision: int) -> None:
        """Renew this replica's lease on a claimed entry while its call runs (cancelled when it ends), so no
        other replica takes the call for abandoned. It stops when the entry is no longer this replica's."""
        lease_s = self.settings.tool_lease_s
        while True:
            await asyncio.sleep(lease_s / 5)
            try:
                revision = await self.save(renewed(entry, utcnow(), lease_s), revision)
            except CasConflict:
                stored, revision = await self.bus.kv_get(S.KV_TOOL_LEDGER, entry.attempt_id, LedgerEntry)
                if stored is None or stored.final is not None or stored.owner != self.replica:
                    return
                entry = stored
            except Exception as err:  # the bus is down: renewed once it is back (the lease covers the gap)
                log.warning("executor: lease on %s not renewed: %r", entry.attempt_id, err)

    async def refuse(self, call: ToolCall, subject_tool: str) -> None:
        """A command on one tool's subject that names another tool: dead-lettered, nothing runs."""
        subject = S.tool_execute(subject_tool)
        reason = (
            f"the message names tool '{call.tool}' but arrived on the subject of '{subject_tool}' ({subject}); "
            "the executor runs only the tool its subject names"
        )
        letter = DeadLetter(
            service="executor", subject=subject, reason=reason, body=call.model_dump_json(by_alias=True)
        )
        await self.bus.publish(
            S.dead_letter("executor"), letter, msg_id=f"dlq-executor-mismatch-{subject_tool}-{call.attempt_id}"
        )
        log.error("executor: dead-lettered %s: %s", subject, reason)

    async def run_attempts(
        self, call: ToolCall, hosted: HostedTool, entry: LedgerEntry, revision: int, stripped: list[str]
    ) -> None:
        """Run the call (``stripped``: the undeclared input fields removed before it, for its result to say)."""
        lease = asyncio.create_task(self.keep_lease(entry, revision)) if revision else None
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
                result = await self.attempt(call, hosted, n)
                delay = retry_delay(contract, result, n, time.monotonic() - started)
                if not result.ok:
                    span.set_attribute(T.LW_FAILURE_TYPE, result.failure_type or "")
                    span.set_status(Status(StatusCode.ERROR, result.error or ""))
                if delay is not None:
                    span.set_attribute(T.LW_BACKOFF_S, round(delay, 4))
                self.attempts.add(1, {"tool": call.tool, "result": "ok" if result.ok else result.failure_type or ""})
                if not result.ok:  # a successful attempt is told by the call's outcome (its ``attempts``)
                    await self.bus.publish(
                        S.tool_attempt(call.tool),
                        ToolAttempt(
                            run_id=call.run_id,
                            call_id=call.call_id,
                            attempt_id=call.attempt_id,
                            tool=call.tool,
                            attempt=n,
                            ok=False,
                            failure_type=result.failure_type,
                            error=result.error,
                            next_delay_s=delay,
                        ),
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
                await self.finish_result(call, hosted, entry, revision, raw)
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
        outcome = self.outcome(
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
                await self.finish(
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
                    await self.finish_result(call, hosted, entry, revision, raw)
                    return
            case Fail():
                fail = step
            case _:
                assert_never(step)
        await self.finish_failure(
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

    # --- finishing ----------------------------------------------------------------------------
    async def save(self, entry: LedgerEntry, revision: int) -> int:
        return await self.bus.kv_put(S.KV_TOOL_LEDGER, entry.attempt_id, entry, revision=revision)

    async def finish_result(
        self, call: ToolCall, hosted: HostedTool, entry: LedgerEntry, revision: int, raw: ToolResultRaw
    ) -> None:
        """The result goes to the validator, unless it cannot travel: a value that is not JSON is a fatal
        failure, one above the hard size limit a failure the model sees (the tool ran; it never runs again)."""
        try:
            body = raw.model_dump_json(by_alias=True)
        except (PydanticSerializationError, ValueError, TypeError) as err:
            detail = f"it returned a value that cannot be sent as JSON ({type(err).__name__}: {str(err)[:200]})"
            await self.finish_failure(call, entry, revision, "fatal", detail, attempts=raw.attempts)
            return
        size, limit = len(body.encode()), self.settings.tool_output_max_bytes
        if size <= limit:
            await self.finish(call, entry, revision, S.RESULT_VALIDATE, body, f"{call.attempt_id}.raw")
            return
        error = SchemaError(
            path="",
            keyword="maxBytes",
            message=f"the result is {_mb(size)}, above the {_mb(limit)} limit for one tool result",
            expected=f"at most {limit} bytes",
            got=f"{size} bytes",
        )
        outcome = self.outcome(
            call,
            "output_invalid",
            f"'{call.tool}' returned {_mb(size)}, more than the {_mb(limit)} a tool result may have. "
            "Ask for less (a narrower query, fewer rows or fields) or continue without it.",
            recoverable=True,
            attempts=raw.attempts,
            errors=[error],
            schema=hosted.contract.output_schema,
        )
        await self.finish(
            call, entry, revision, S.failure("output_invalid", call.tool), outcome, failed_id(call, "output_invalid")
        )

    async def finish(
        self, call: ToolCall, entry: LedgerEntry, revision: int, subject: str, payload: Wire | str, msg_id: str
    ) -> None:
        """Record the final message in the ledger, then publish it (a redelivery republishes it)."""
        body = payload if isinstance(payload, str) else payload.model_dump_json(by_alias=True)
        unknown = isinstance(payload, ToolOutcome) and payload.failure_type == "unknown_outcome"
        entry.final = ours = FinalPublish(subject=subject, msg_id=msg_id, payload=body, unknown_outcome=unknown)
        for _ in range(FINAL_WRITES):
            try:
                revision = await self.save(entry, revision)
                break
            except CasConflict:
                stored, revision = await self.bus.kv_get(S.KV_TOOL_LEDGER, entry.attempt_id, LedgerEntry)
                action = on_final_conflict(stored, ours, self.replica)
                match action:
                    case "rewrite":  # this replica's lease renewals moved the entry on
                        continue
                    case "replace":  # another replica declared it unknown while this one ran it: known wins
                        assert stored is not None and stored.final is not None
                        log.warning(
                            "executor: %s was recorded as an unknown outcome elsewhere; its known result replaces it",
                            entry.attempt_id,
                        )
                        continue
                    case "adopt":  # another delivery of this call got its final recorded first: it counts
                        assert stored is not None
                        entry.final = stored.final
                        break
                    case "retry_delivery":
                        raise
                    case _:
                        assert_never(action)
            except (MaxPayloadError, APIError) as err:
                if not refused_for_good(err):
                    raise
                await self.undeliverable(call, entry, revision, err)  # e.g. the result exceeds the bucket's limits
                return
        else:
            raise CasConflict(f"ledger entry {entry.attempt_id} kept changing under its final write")
        self.fault("after_final_recorded")
        await self.deliver(call, entry, revision)

    async def deliver(self, call: ToolCall, entry: LedgerEntry, revision: int) -> None:
        """Publish the recorded final message."""
        assert entry.final is not None
        try:
            await self.publish_final(entry.final, call.run_id)
        except (MaxPayloadError, APIError) as err:
            if not refused_for_good(err):
                raise  # e.g. the server is busy: the redelivery publishes the recorded final again
            await self.undeliverable(call, entry, revision, err)

    async def undeliverable(self, call: ToolCall, entry: LedgerEntry, revision: int, err: Exception) -> None:
        """The server refuses the final message for good: the call ends as a failure event that says so,
        recorded in its place (never a command dead-lettered with the run left running)."""
        assert entry.final is not None
        log.error("executor: %s refused on %s: %r", entry.final.subject, call.attempt_id, err)
        detail = f"its result could not be delivered ({type(err).__name__}: {str(err)[:200]})"
        outcome = self.outcome(call, "fatal", model_error(call.tool, "fatal", detail, 1), recoverable=False, attempts=1)
        entry.final = FinalPublish(
            subject=S.failure("fatal", call.tool),
            msg_id=f"{call.attempt_id}.undeliverable",
            payload=outcome.model_dump_json(by_alias=True),
        )
        await self.save(entry, revision)
        await self.publish_final(entry.final, call.run_id)

    async def publish_final(self, final: FinalPublish, run_id: str | None) -> None:
        await self.bus.publish(final.subject, final.payload.encode(), msg_id=final.msg_id, run_id=run_id)

    async def finish_failure(
        self,
        call: ToolCall,
        entry: LedgerEntry,
        revision: int,
        ftype: FailureType,
        detail: str,
        *,
        recoverable: bool = False,
        boundary: str | None = None,
        attempts: int = 1,
        effect: str | None = None,
    ) -> None:
        outcome = self.outcome(
            call,
            ftype,
            model_error(call.tool, ftype, detail, attempts),
            recoverable=recoverable,
            attempts=attempts,
            boundary=boundary,
            effect=effect,
        )
        await self.finish(call, entry, revision, S.failure(ftype, call.tool), outcome, failed_id(call, ftype))

    async def fail(
        self, call: ToolCall, ftype: FailureType, error: str, *, recoverable: bool, attempts: int, **extra: Any
    ) -> None:
        outcome = self.outcome(call, ftype, error, recoverable=recoverable, attempts=attempts, **extra)
        await self.bus.publish(S.failure(ftype, call.tool), outcome, msg_id=failed_id(call, ftype))

    @staticmethod
    def outcome(
        call: ToolCall, ftype: FailureType, error: str, *, recoverable: bool, attempts: int, **extra: Any
    ) -> ToolOutcome:
        return ToolOutcome.model_validate(
            {
                "run_id": call.run_id,
                "iteration": call.iteration,
                "call_id": call.call_id,
                "attempt_id": call.attempt_id,
                "tool": call.tool,
                "requested_tool": call.requested_tool,
                "arguments": call.arguments,
                "success": False,
                "error": error,
                "recoverable": recoverable,
                "failure_type": ftype,
                "attempts": attempts,
                "fallback_from": call.fallback_from,
                **{k: v for k, v in extra.items() if v is not None},
            }
        )


FINAL_WRITES = 5  # compare-and-swaps of a final before the delivery is retried (each lost one re-reads)


def renewed_at(lease_s: float) -> datetime:
    return utcnow() + timedelta(seconds=lease_s)


def failed_id(call: ToolCall, failure_type: str) -> str:
    """The message id of a call's failure event: one per failure type, so the validator's outcome
    (``<attempt>.validated``) and an executor's failure of the same attempt never de-duplicate each
    other, while a redelivery of the same event does."""
    return f"{call.attempt_id}.failed.{S.token(failure_type)}"


def refused_for_good(err: Exception) -> bool:
    """A refusal that a redelivery would only meet again: too large for the connection, or a limit of the
    stream or bucket (JetStream reports "maximum bytes exceeded" as a 503 with its own error code)."""
    if isinstance(err, MaxPayloadError):
        return True
    if not isinstance(err, APIError):
        return False
    text = (err.description or "").lower()
    return bool(err.code and 400 <= err.code < 500 and err.code != 408) or "maximum" in text or "exceed" in text


def _mb(size: int) -> str:
    return f"{size / 1_000_000:.1f} MB"
