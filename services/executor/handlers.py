"""Executor bus handlers: validate arguments, run the tool exactly as often as is safe.

The executor is the *one* layer that retries transient tool failures (exponential backoff,
full jitter, Retry-After, bounded by attempts and elapsed time, per-tool policy). A
schema failure is never retried here. When retries are spent on a recoverable failure:
the tool's fallback runs (through the bus, so another executor may host it), else its
boundary applies (``use_cached`` here; ``skip_and_note`` and ``ask_human`` in the planner).

Here: registration and the call's entry (``on_call``). Its parts, each handed what it needs:
``ownership`` (reclaim, the owner lease), ``attempts`` (retries, fallback, cached result) and
``finishing`` (the final recorded in the ledger, then delivered).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from typing import Any

from services.executor import ids
from services.executor.attempts import Attempts, raw_result
from services.executor.finishing import Finisher
from services.executor.ledger import claim
from services.executor.ownership import Ownership
from services.executor.registry import ToolRegistry
from services.executor.scripted import scripted_around
from shared import metrics as M
from shared import subjects as S
from shared import telemetry as T
from shared.bus import Bus, CasConflict, current_deliveries
from shared.contracts.registration import validator_for
from shared.contracts.undeclared import admit
from shared.contracts.validation import format_for_model
from shared.messages import DeadLetter, McpServerStatus, ToolCall
from shared.settings import FaultPoint, Settings

__all__ = ["Executor", "raw_result"]  # what callers import from here

log = logging.getLogger("loopwarden.executor")


class Executor:
    outcome = staticmethod(Finisher.outcome)  # a call's failure outcome, as the executor writes it

    def __init__(self, bus: Bus, settings: Settings, telemetry: T.Telemetry, registry: ToolRegistry) -> None:
        self.bus, self.settings, self.registry = bus, settings, registry
        self.tracer = telemetry.tracer("loopwarden.executor")
        meter = telemetry.meter("loopwarden.executor")
        self.attempts = M.Tally(meter, M.TOOL_ATTEMPTS, description="tool attempts by result")
        durations = meter.create_histogram(
            M.TOOL_DURATION,
            unit="s",
            description="tool attempts' duration, by tool and result",
            explicit_bucket_boundaries_advisory=M.DURATION_BUCKETS_S,
        )
        self.undeclared = meter.create_counter(
            M.TOOL_UNDECLARED, description="tool calls that carried undeclared input fields"
        )
        self._consuming: set[str] = set()
        self.mounts: list[Any] = []
        self._hosting: set[asyncio.Task[None]] = set()  # tools of late MCP servers being hosted
        self.fault_point: FaultPoint | None = settings.fault_inject  # read once, at start
        # This replica, as the owner a ledger entry names (a restarted process is another owner).
        self.replica = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.finisher = Finisher(bus, settings, self.replica, self.fault)
        self.ownership = Ownership(bus, settings, self.replica, self.finisher)
        self.calls = Attempts(
            bus, settings, self.tracer, self.attempts, self.fault, self.ownership, self.finisher, durations
        )
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
                await self.finisher.fail(
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
            entry = claim(None, call.attempt_id, call.tool, contract.idempotent, delivery, **self.ownership.lease())
            revision = 0
            if not (contract.idempotent and delivery == 1):
                # A non-idempotent call (or any redelivery) is claimed with a create before the tool
                # runs (one round trip: the common case reads nothing); only a key that exists already
                # is read and decided upon. An idempotent call's first delivery runs at once (running
                # it again is harmless) and records its final with that create (``finish``).
                try:
                    revision = await self.finisher.save(entry, 0)  # recorded *before* the tool runs
                except CasConflict:
                    claimed = await self.ownership.reclaim(call, contract.idempotent, span)
                    if claimed is None:
                        return
                    entry, revision = claimed
            self.fault("after_start_recorded")
            around = await scripted_around(self.bus, self.settings, call)  # a scripted run's tool, wrapped once
            await self.calls.run_attempts(call, hosted, entry, revision, stripped, around)
            self.fault("after_final_published")

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
            S.dead_letter("executor"), letter, msg_id=ids.mismatch_letter(subject_tool, call.attempt_id)
        )
        log.error("executor: dead-lettered %s: %s", subject, reason)
