"""The end of a tool call: its final message recorded in the ledger, then published (a redelivery
republishes it); a result that cannot travel, or that the server refuses for good, ends as a failure
event recorded in its place."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, assert_never

from nats.errors import MaxPayloadError
from nats.js.errors import APIError
from pydantic_core import PydanticSerializationError

from services.executor import ids
from services.executor.ledger import FinalPublish, LedgerEntry, on_final_conflict
from services.executor.recovery import model_error
from services.executor.registry import HostedTool
from shared import subjects as S
from shared.bus import Bus, CasConflict
from shared.call_identity import CallIdentity
from shared.failures import FailureType, replaceable
from shared.messages import SchemaError, ToolCall, ToolOutcome, ToolResultRaw, Wire
from shared.settings import FaultPoint, Settings

log = logging.getLogger("loopwarden.executor")


class Finisher:
    """Ends this replica's calls: ``finish`` records a call's final and publishes it."""

    def __init__(self, bus: Bus, settings: Settings, replica: str, fault: Callable[[FaultPoint], None]) -> None:
        self.bus, self.settings, self.replica, self.fault = bus, settings, replica, fault

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
            call,
            entry,
            revision,
            S.failure("output_invalid", call.tool),
            outcome,
            ids.failed(call.attempt_id, "output_invalid"),
        )

    async def finish(
        self, call: ToolCall, entry: LedgerEntry, revision: int, subject: str, payload: Wire | str, msg_id: str
    ) -> None:
        """Record the final message in the ledger, then publish it (a redelivery republishes it). An unclaimed
        call (an idempotent tool's first delivery: ``revision`` 0) publishes it beside the create that records
        it (``early``), in the same write, instead of after the create's answer (``ledger.py``)."""
        body = payload if isinstance(payload, str) else payload.model_dump_json(by_alias=True)
        unknown = isinstance(payload, ToolOutcome) and replaceable(payload.failure_type)
        entry.final = ours = FinalPublish(subject=subject, msg_id=msg_id, payload=body, unknown_outcome=unknown)
        early = None
        if revision == 0 and entry.idempotent and len(body) <= EARLY_MAX_BYTES:
            early = asyncio.ensure_future(self.publish_final(ours, call.run_id))  # sent in the create's write
        try:
            recorded = await self.record(call, entry, revision, ours)
        except BaseException:
            if early is not None:
                await _settled(early)
            raise
        if recorded is None:  # refused for good: a failure recorded and published in its place
            if early is not None:
                await _settled(early)
            return
        self.fault("after_final_recorded")
        if early is not None and entry.final is ours:  # published already: its PubAck is the delivery's
            try:
                await early
            except (MaxPayloadError, APIError) as err:
                if not refused_for_good(err):
                    raise
                await self.undeliverable(call, entry, recorded, err)
            return
        if early is not None:  # another delivery's final counts: it is published below (same id: one is kept)
            await _settled(early)
        await self.deliver(call, entry, recorded)

    async def record(self, call: ToolCall, entry: LedgerEntry, revision: int, ours: FinalPublish) -> int | None:
        """Write ``ours`` as the entry's final under compare-and-swap; the revision it is stored at, or None
        when the server refused it for good (``undeliverable`` recorded and published a failure instead).
        A lost compare-and-swap decides by ``on_final_conflict``: ``entry.final`` is then what counts."""
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
                return None
        else:
            raise CasConflict(f"ledger entry {entry.attempt_id} kept changing under its final write")
        return revision

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
            msg_id=ids.undeliverable(call.attempt_id),
            payload=outcome.model_dump_json(by_alias=True),
        )
        await self.save(entry, revision)
        await self.publish_final(entry.final, call.run_id)

    async def publish_final(self, ending: FinalPublish, run_id: str | None) -> None:
        await self.bus.publish(ending.subject, ending.payload.encode(), msg_id=ending.msg_id, run_id=run_id)

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
        await self.finish(
            call, entry, revision, S.failure(ftype, call.tool), outcome, ids.failed(call.attempt_id, ftype)
        )

    async def fail(
        self, call: ToolCall, ftype: FailureType, error: str, *, recoverable: bool, attempts: int, **extra: Any
    ) -> None:
        outcome = self.outcome(call, ftype, error, recoverable=recoverable, attempts=attempts, **extra)
        await self.bus.publish(S.failure(ftype, call.tool), outcome, msg_id=ids.failed(call.attempt_id, ftype))

    @staticmethod
    def outcome(
        call: ToolCall, ftype: FailureType, error: str, *, recoverable: bool, attempts: int, **extra: Any
    ) -> ToolOutcome:
        return CallIdentity.of(call).failed(ftype, error, recoverable=recoverable, attempts=attempts, **extra)


FINAL_WRITES = 5  # compare-and-swaps of a final before the delivery is retried (each lost one re-reads)
EARLY_MAX_BYTES = 16 * 1024  # an unclaimed call's final up to this size is published beside its create


async def _settled(task: asyncio.Future[None]) -> None:
    """Wait for a publish whose outcome no longer decides anything (another final counts, or the delivery fails)."""
    with contextlib.suppress(Exception):
        await task


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
