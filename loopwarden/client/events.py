"""A run's events as the client hands them out (``Event``, a live ``Watch``), and the tool figures counted from them."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shared import subjects as S
from shared.bus import RUN_ID_HEADER
from shared.messages import (
    Corrected,
    ToolAttempt,
    ToolOutcome,
    call_attempts,
)


@dataclass
class Event:
    """One entry of a run's history, whatever its contract."""

    subject: str
    payload: dict[str, Any]
    run_id: str
    headers: dict[str, str] = field(default_factory=dict)  # as published (``traceparent``: the run's trace)
    seq: int = 0  # its sequence in the stream it was read from
    time: datetime | None = None  # when it was stored (stored events)

    @property
    def kind(self) -> str:
        return S.stem(self.subject).removeprefix(f"{S.P}.evt.")


class Watch:
    """A run's live events (``Client.watch``): iterate it; ``close`` (or leave its ``async with``) unsubscribes."""

    def __init__(self, run_id: str, event: Callable[[Any], Awaitable[Event]]) -> None:
        self.run_id = run_id
        self.event = event  # a received message as an Event (``Client.event``)
        self.subs: list[Any] = []
        self._queue: asyncio.Queue[Event] = asyncio.Queue()

    async def on_msg(self, msg: Any) -> None:
        if (msg.headers or {}).get(RUN_ID_HEADER, "") == self.run_id:
            await self._queue.put(await self.event(msg))

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> Event:
        return await self._queue.get()

    async def next(self, timeout: float | None = None) -> Event | None:
        """The next event, or None after ``timeout`` seconds."""
        try:
            async with asyncio.timeout(timeout):
                return await self._queue.get()
        except TimeoutError:
            return None

    async def close(self) -> None:
        subs, self.subs = self.subs, []
        for sub in subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def __aenter__(self) -> Watch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


@dataclass(frozen=True)
class _Polled:
    """A tenant-bound client's watch: the task that asks for the run's new events (``close`` ends it)."""

    task: asyncio.Task[None]

    async def unsubscribe(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.task


def _json(data: bytes) -> dict[str, Any]:

    try:
        value = json.loads(data)
    except ValueError:
        return {"raw": data.decode(errors="replace")}
    return value if isinstance(value, dict) else {"value": value}


def tool_outcomes(events: list[Event]) -> dict[str, dict[str, int]]:
    """Per tool the model called: how many calls ended each way (``succeeded`` or a failure type), from
    the final outcomes in a run's events (an attempt the executor retried is not an outcome)."""
    out: dict[str, dict[str, int]] = {}
    for e in events:
        succeeded = e.subject.startswith(S.TOOL_SUCCEEDED_PREFIX)
        if not (succeeded or e.subject.startswith(S.FAILURE_PREFIX)) or "attempt_id" not in e.payload:
            continue  # not a tool call's outcome (a loop, budget or judge failure)
        try:
            o = ToolOutcome.model_validate(e.payload)
        except ValueError:
            continue
        if o.will_retry:
            continue
        kind = "succeeded" if o.success else str(o.failure_type)
        row = out.setdefault(o.requested_tool, {})
        row[kind] = row.get(kind, 0) + 1
    return out


def tool_metrics(events: list[Event]) -> dict[str, dict[str, float]]:
    """Per tool: parse success rate, validation pass rate, repair rate, correction success rate."""
    counts: dict[str, dict[str, int]] = {}

    def c(tool: str) -> dict[str, int]:
        return counts.setdefault(
            tool,
            {
                "outputs": 0,
                "parsed": 0,
                "valid_first": 0,
                "repaired": 0,
                "schema_failures": 0,
                "recovered": 0,
                "attempts": 0,
                "retried": 0,
            },
        )

    calls: dict[str, list[Any]] = {}  # per attempt id: [tool, its attempt events, its final outcome's attempts]

    def call(attempt_id: str, tool: str) -> list[Any]:
        return calls.setdefault(attempt_id, [tool, 0, 0])

    for e in events:
        if e.subject.startswith(S.TOOL_SUCCEEDED_PREFIX) or e.subject.startswith(f"{S.FAILURE_PREFIX}.output_invalid"):
            o = ToolOutcome.model_validate(e.payload)
            row = c(o.tool)
            row["outputs"] += 1
            row["parsed"] += int(o.parsed)
            row["valid_first"] += int(o.success and not o.repaired)
            row["repaired"] += int(o.repaired)
        if e.subject.startswith(f"{S.FAILURE_PREFIX}.input_invalid") or e.subject.startswith(
            f"{S.FAILURE_PREFIX}.output_invalid"
        ):
            c(ToolOutcome.model_validate(e.payload).requested_tool)["schema_failures"] += 1
        if S.stem(e.subject) == S.run_event("corrected"):  # a streak of schema failures the model fixed
            corrected = Corrected.model_validate(e.payload)
            c(corrected.detail.tool)["recovered"] += corrected.detail.after
        if e.subject.startswith(S.TOOL_ATTEMPT_PREFIX):
            a = ToolAttempt.model_validate(e.payload)
            call(a.attempt_id, a.tool)[1] += 1
            c(a.tool)["retried"] += int(a.next_delay_s is not None)
        elif e.kind.startswith(("tool.succeeded.", "failure.")) and "attempt_id" in e.payload:
            o = ToolOutcome.model_validate(e.payload)
            if not o.will_retry:  # the call's final outcome
                call(o.attempt_id, o.tool)[2] = o.attempts
    for tool, events_of_call, final_attempts in calls.values():
        c(tool)["attempts"] += call_attempts(final_attempts, events_of_call)
    out: dict[str, dict[str, float]] = {}
    for tool, k in sorted(counts.items()):
        outputs = k["outputs"] or 0
        out[tool] = {
            "outputs": outputs,
            "parse_success_rate": k["parsed"] / outputs if outputs else 1.0,
            "validation_pass_rate": k["valid_first"] / outputs if outputs else 1.0,
            "repair_rate": k["repaired"] / outputs if outputs else 0.0,
            "schema_failures": k["schema_failures"],
            "correction_success_rate": k["recovered"] / k["schema_failures"] if k["schema_failures"] else 1.0,
            "attempts": k["attempts"],
            "retried_attempts": k["retried"],
        }
    return out
