"""Validator bus handler: raw tool results in, validated outcomes (or schema failures) out."""

from __future__ import annotations

import logging

from services.validator import ids
from services.validator.checking import outcome_of
from shared import metrics as M
from shared import subjects as S
from shared import telemetry as T
from shared.bus import Bus, TryLater
from shared.canonical import cache_key
from shared.contracts.catalogue import ContractCatalogue
from shared.messages import CachedToolResult, ToolContract, ToolResultRaw

log = logging.getLogger("loopwarden.validator")


class Validator:
    def __init__(self, bus: Bus, telemetry: T.Telemetry) -> None:
        self.bus = bus
        self.tracer = telemetry.tracer("loopwarden.validator")
        meter = telemetry.meter("loopwarden.validator")
        self.outputs = M.Tally(
            meter,
            M.TOOL_OUTPUTS,
            description="validated tool outputs by result: valid, repaired, invalid, unparseable",
        )
        self.catalogue = ContractCatalogue(bus)

    def register(self) -> None:
        self.bus.consumer(durable=S.DURABLE_VALIDATOR, filter_subjects=[S.RESULT_VALIDATE], model=ToolResultRaw)(
            self.on_raw
        )

    async def contract(self, tool: str) -> ToolContract:
        contract = await self.catalogue.get(tool)  # a re-registered contract is seen within catalogue.FRESH_S
        if contract is None:  # handed back, not held: results of every other tool share this consumer
            raise TryLater(f"no contract registered for tool '{tool}'", delay=1.0, in_place=False)
        return contract

    async def on_raw(self, raw: ToolResultRaw) -> None:
        contract = await self.contract(raw.tool)
        with self.tracer.start_as_current_span(
            f"validate_output {raw.tool}",
            attributes={T.GEN_AI_TOOL_NAME: raw.tool, T.LW_RUN_ID: raw.run_id},
        ) as span:
            checked = outcome_of(contract, raw)
            span.set_attribute("loopwarden.validation.result", checked.result)
        self.outputs.add(1, {"tool": raw.tool, "result": checked.result})
        outcome = checked.outcome
        if outcome.success:
            if not raw.cached and contract.boundary == "use_cached":  # only read for that boundary
                await self.bus.kv_put(
                    S.KV_TOOL_CACHE,
                    cache_key(raw.tool, raw.arguments),
                    CachedToolResult(tool=raw.tool, data=outcome.data),
                )
            subject = S.tool_succeeded(raw.tool)
        else:
            subject = S.failure("output_invalid", raw.tool)
        # Its own id, not the executor's failure ids (``<attempt>.failed.<type>``): an unknown_outcome the
        # executor publishes for an attempt whose result the stream kept is stored, not dropped as a duplicate.
        await self.bus.publish(subject, outcome, msg_id=ids.validated(raw.attempt_id))
