"""What operators see of the services themselves: dead letters and their requeue, error replies, MCP servers."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from shared.messages.wire import Wire, utcnow

# --- dead letters -----------------------------------------------------------------------------


class DeadLetter(Wire):
    """A message a service gave up on (``lw.v1.dlq.<service>``), with the reason. Its number is its
    sequence in LW_DLQ (``loopwarden dlq`` shows it; ``loopwarden dlq requeue N`` hands it back)."""

    service: str
    subject: str
    reason: str
    body: str
    headers: dict[str, str] = Field(default_factory=dict)
    deliveries: int = Field(1, description="how often the message was delivered, its earlier requeues included")
    at: datetime = Field(default_factory=utcnow)
    requeued_from: int | None = Field(
        None, description="the number (LW_DLQ sequence) of the letter this message was requeued from"
    )
    requeue_to: str | None = Field(
        None,
        description="where `loopwarden dlq requeue` hands it back (the requeue subject of the consumer that took "
        "it); None: it was not taken from a durable consumer (a request) and cannot be handed back",
    )


class Requeue(Wire):
    """Command on a letter's ``requeue_to`` (``lw.v1.cmd.requeue.<service>[.<scope>]``): a dead letter
    handed back to the service that gave up on it. The command names the letter only: the service reads
    it from LW_DLQ itself, where only it (or the admin) can have written under its own dead-letter subject,
    and runs that message (subject, body, headers) through the consumer that takes it, as a redelivery.
    Whoever may requeue can hand back what the service gave up on, never make it run a message of their own."""

    letter: int = Field(ge=1, description="the letter's number (its LW_DLQ sequence)")


class LetterHandled(Wire):
    """Event ``lw.v1.evt.letter.handled.<run>``: a dead letter handed back (``Requeue``) was run through its
    consumer and handled (acknowledged, not dead-lettered again): the run it belonged to waits on it no more."""

    letter: int = Field(ge=1, description="the letter's number (its LW_DLQ sequence)")
    service: str = Field(max_length=64, description="the service that handled it")
    subject: str = Field(max_length=512, description="the handled message's subject")
    run_id: str | None = Field(None, max_length=64)


class ReplicaRecord(Wire):
    """A running service replica as it heartbeats into ``lw_replicas`` (key ``<service>.<instance>``): what it
    is, since when, and which durables it pulls. A key not rewritten within ``LW_REPLICA_TTL_S`` expires with
    the bucket's age limit (and readers ignore one older than that): its replica is gone."""

    service: str = Field(max_length=64)
    instance: str = Field(max_length=64, description="this process (a random id per start)")
    version: str = Field("", max_length=64)
    host: str = Field("", max_length=256, description="host:pid")
    started_at: datetime = Field(default_factory=utcnow)
    seen_at: datetime = Field(default_factory=utcnow, description="its last heartbeat")
    durables: list[str] = Field(default_factory=list, max_length=4096, description="the durables it pulls")


class ErrorReply(Wire):
    """The answer to a request a service could not serve (malformed, or its handler failed)."""

    ok: Literal[False] = False
    error: str


class McpServerStatus(Wire):
    """Event ``evt.mcp.server.<name>`` and the server's entry in ``lw_mcp_servers``: a mounted MCP
    server's state as the executor that runs it sees it."""

    server: str
    executor: str = Field(description="the executor process (host:pid) running this copy of the server")
    state: Literal["starting", "up", "failed", "down", "stopped"]
    detail: str = ""
    tools: list[str] = Field(default_factory=list, description="mounted tool names")
    refused: dict[str, str] = Field(default_factory=dict, description="tool -> why it was not mounted")
    restarts: int = 0
    next_start_in_s: float | None = None
    start_ms: float | None = Field(None, description="start-up (spawn, handshake, tool list) time")
    at: datetime = Field(default_factory=utcnow)
