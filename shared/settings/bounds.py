"""What the shared JetStream store may hold: every stream's and bucket's byte bound (and a message bound where
a count matters), and the largest value a bucket hands a reader by reference (docs/operations.md, "Bounds").

Each stream discards what its bound says (``shared/bus/infra.py``): ``LW_SUBMIT``, ``LW_CMD`` and ``LW_EVT``
refuse a new message when full (a submit is refused to its client, a service's publish fails and is retried,
then dead-lettered: nothing accepted is dropped); ``LW_DLQ`` drops its oldest letters. Buckets refuse a write
when full. The sum of every bound is reserved in the server's JetStream store (``max_file_store``): a server
that offers less refuses the stream, and bootstrap says which.
"""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator

MIB, GIB = 1024 * 1024, 1024 * 1024 * 1024
# LW_PAYLOADS has its own setting (LW_PAYLOAD_MAX_BYTES); these are the others.
STREAM_MAX_BYTES: dict[str, int] = {
    "LW_SUBMIT": 1 * GIB,
    "LW_CMD": 2 * GIB,
    "LW_EVT": 8 * GIB,
    "LW_DLQ": 1 * GIB,
    "LW_FLOW": 256 * MIB,  # the tickets of runs waiting for their tenant's share (docs/flow-control.md)
}
# A count bound where many small messages matter: submits a client sends, letters.
STREAM_MAX_MSGS: dict[str, int] = {"LW_SUBMIT": 1_000_000, "LW_DLQ": 200_000}
BUCKET_MAX_BYTES: dict[str, int] = {
    "lw_runs": 1 * GIB,
    "lw_history": 4 * GIB,
    "lw_model_calls": 4 * GIB,
    "lw_tool_ledger": 2 * GIB,
    "lw_tool_cache": 1 * GIB,
    "lw_escalations": 512 * MIB,
    "*": 256 * MIB,
}
# The largest value read by reference (``inflate_value``) per bucket: what a record there really is. An agent's
# definition is at most 20,000 characters of instructions and 1,024 tool names; a budget ledger, a contract, a
# verdict are small; a run's history and model answers, the tool ledger and cache hold tool outputs.
VALUE_MAX_BYTES: dict[str, int] = {
    "lw_agents": 1 * MIB,
    "lw_budgets": 1 * MIB,
    "lw_contracts": 4 * MIB,
    "lw_verdicts": 1 * MIB,
    "lw_lessons": 1 * MIB,
    "lw_requeues": 1 * MIB,
    "lw_replicas": 1 * MIB,
    "lw_console_sessions": 1 * MIB,
    "lw_mcp_servers": 1 * MIB,
    "lw_script_cursors": 1 * MIB,
    "*": 64 * MIB,
}


def _at_least(name: str, v: dict[str, int], floor: int) -> dict[str, int]:
    for key, size in v.items():
        if size < floor:
            raise ValueError(f"{key}: at least {floor} (got {size})")
    return v


class BoundSettings(BaseModel):
    stream_max_bytes: dict[str, int] = Field(
        default_factory=lambda: dict(STREAM_MAX_BYTES),
        description="JSON: stream -> the bytes it may hold, over the defaults (LW_SUBMIT 1 GiB, LW_CMD 2 GiB, "
        "LW_EVT 8 GiB, LW_DLQ 1 GiB, LW_FLOW 256 MiB; LW_PAYLOADS: LW_PAYLOAD_MAX_BYTES)",
    )
    stream_max_msgs: dict[str, int] = Field(
        default_factory=lambda: dict(STREAM_MAX_MSGS),
        description="JSON: stream -> the messages it may hold, over the defaults (LW_SUBMIT 1,000,000, "
        "LW_DLQ 200,000; the others: no count bound)",
    )
    bucket_max_bytes: dict[str, int] = Field(
        default_factory=lambda: dict(BUCKET_MAX_BYTES),
        description="JSON: bucket -> the bytes it may hold, over the defaults; '*' for every other bucket",
    )
    value_max_bytes: dict[str, int] = Field(
        default_factory=lambda: dict(VALUE_MAX_BYTES),
        description="JSON: bucket -> the largest value read from it by reference (a larger one is refused before "
        "it is fetched), over the defaults; '*' for every other bucket",
    )

    @field_validator("stream_max_bytes")
    @classmethod
    def _streams(cls, v: dict[str, int]) -> dict[str, int]:
        unknown = sorted(set(v) - set(STREAM_MAX_BYTES))
        if unknown:
            raise ValueError(f"not a bounded stream: {', '.join(unknown)} (known: {', '.join(STREAM_MAX_BYTES)})")
        return {**STREAM_MAX_BYTES, **_at_least("stream", v, MIB)}

    @field_validator("stream_max_msgs")
    @classmethod
    def _counts(cls, v: dict[str, int]) -> dict[str, int]:
        unknown = sorted(set(v) - set(STREAM_MAX_BYTES))
        if unknown:
            raise ValueError(f"not a bounded stream: {', '.join(unknown)} (known: {', '.join(STREAM_MAX_BYTES)})")
        return {**STREAM_MAX_MSGS, **_at_least("stream", v, 100)}

    @field_validator("bucket_max_bytes")
    @classmethod
    def _buckets(cls, v: dict[str, int]) -> dict[str, int]:
        return {**BUCKET_MAX_BYTES, **_at_least("bucket", v, MIB)}

    @field_validator("value_max_bytes")
    @classmethod
    def _values(cls, v: dict[str, int]) -> dict[str, int]:
        return {**VALUE_MAX_BYTES, **_at_least("bucket", v, 1024)}

    def stream_bytes(self, stream: str) -> int | None:
        """The byte bound of ``stream`` (None: not one of these; LW_PAYLOADS has its own)."""
        return self.stream_max_bytes.get(stream)

    def stream_msgs(self, stream: str) -> int | None:
        return self.stream_max_msgs.get(stream)

    def bucket_bytes(self, bucket: str) -> int:
        return self.bucket_max_bytes.get(bucket, self.bucket_max_bytes["*"])

    def value_limit(self, bucket: str) -> int:
        """The largest value of ``bucket`` read by reference (``LW_VALUE_MAX_BYTES``)."""
        return self.value_max_bytes.get(bucket, self.value_max_bytes["*"])
