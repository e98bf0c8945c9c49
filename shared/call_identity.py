"""One tool call's identity, as every message about it carries it.

A ``ToolCall``, its ``ToolResultRaw``, its ``ToolAttempt`` events and its ``ToolOutcome`` all say which
call they are about with the same fields (run, iteration, call, attempt, the tool that ran, the tool
the model asked for, the arguments, the fallback it came from). ``CallIdentity`` holds them once; its
named constructors build each message from it, so no builder copies the fields by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from shared.messages import FailureType, FallbackNote, ToolAttempt, ToolCall, ToolOutcome, ToolResultRaw


@dataclass(frozen=True)
class CallIdentity:
    run_id: str
    iteration: int
    call_id: str
    attempt_id: str
    tool: str
    requested_tool: str
    arguments: dict[str, Any] = field(default_factory=dict)
    fallback_from: FallbackNote | None = None
    tenant: str | None = None  # the run's (a queue item filed from the call's failure event says whose it is)

    @classmethod
    def of(cls, message: ToolCall | ToolResultRaw | ToolOutcome) -> CallIdentity:
        """The identity a call message carries."""
        return cls(**{name: getattr(message, name) for name in _NAMES})

    def fields(self) -> dict[str, Any]:
        """The identity's fields by name, as every call message spells them."""
        return {name: getattr(self, name) for name in _NAMES}

    def as_fallback(self, tool: str, note: FallbackNote) -> CallIdentity:
        """The same call run again by its fallback ``tool``: its own attempt id, the reason in ``note``."""
        return replace(self, attempt_id=f"{self.attempt_id}.fb.{tool}", tool=tool, fallback_from=note)

    def call(self) -> ToolCall:
        """The command that runs this call."""
        return ToolCall(**self.fields())

    def raw(self, output: Any, attempts: int, **extra: Any) -> ToolResultRaw:
        """What the validator checks: this call's output (``extra``: the other ``ToolResultRaw`` fields)."""
        return ToolResultRaw(**self.fields(), output=output, attempts=attempts, **extra)

    def attempt_failed(
        self, n: int, failure_type: FailureType | None, error: str | None, next_delay_s: float | None
    ) -> ToolAttempt:
        """The event of this call's ``n``-th attempt, which failed."""
        return ToolAttempt(
            run_id=self.run_id,
            call_id=self.call_id,
            attempt_id=self.attempt_id,
            tool=self.tool,
            attempt=n,
            ok=False,
            failure_type=failure_type,
            error=error,
            next_delay_s=next_delay_s,
        )

    def outcome(self, *, success: bool, **fields: Any) -> ToolOutcome:
        """This call's outcome (``fields``: the other ``ToolOutcome`` fields, by name or alias)."""
        return ToolOutcome.model_validate({**self.fields(), "success": success, **fields})

    def failed(
        self, failure_type: FailureType, error: str, *, recoverable: bool, attempts: int, **extra: Any
    ) -> ToolOutcome:
        """This call's failure (``extra``: further ``ToolOutcome`` fields; a ``None`` leaves the default)."""
        return self.outcome(
            success=False,
            error=error,
            recoverable=recoverable,
            failure_type=failure_type,
            attempts=attempts,
            **{k: v for k, v in extra.items() if v is not None},
        )


_NAMES = tuple(f.name for f in fields(CallIdentity))  # the identity's fields, in order (read per message)
