"""The base of every contract, and the ids they carry: each bounded and patterned."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

RUN_ID_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
# Every id in every contract is bounded and patterned: an id may end up in a subject, a message id or a KV
# key, and an over-long subject makes nats-server close the connection of whoever publishes it.
NAME_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"  # tool names, tenants, operators, services
CALL_ID_PATTERN = r"^[A-Za-z0-9_.:-]{1,128}$"  # a model's tool_use id, a candidate: never a subject token
ESCALATION_ID_PATTERN = r"^[A-Za-z0-9_-]{1,256}$"  # derived from a run, an iteration and a call or candidate
ATTEMPT_ID_PATTERN = r"^[A-Za-z0-9_=/.:-]{1,512}$"  # a KV key: <run>.i<n>.<call>[.fb.<tool>]..., or a child run
DIGEST_PATTERN = r"^[0-9a-f]{64}$"
TASK_MAX_CHARS = 100_000  # a run's task; a larger input travels as a tool's data, not as the prompt
RunId = Annotated[str, Field(pattern=RUN_ID_PATTERN)]
Name = Annotated[str, Field(pattern=NAME_PATTERN)]
CallId = Annotated[str, Field(pattern=CALL_ID_PATTERN)]
EscalationId = Annotated[str, Field(pattern=ESCALATION_ID_PATTERN)]
AttemptId = Annotated[str, Field(pattern=ATTEMPT_ID_PATTERN)]

Boundary = Literal["skip_and_note", "use_cached", "ask_human"]


def utcnow() -> datetime:
    return datetime.now(UTC)


class Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
