"""The bus: where NATS is, how JetStream delivers and de-duplicates, how many messages a replica holds."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import AliasChoices, BaseModel, Field, PositiveInt, SecretStr, field_validator

_DURATION = re.compile(r"^(\d+)(ms|s|m|h)$")
_DURATION_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}


def sync_interval(value: str) -> str:
    """``LW_NATS_SYNC_INTERVAL`` as nats-server's ``sync_interval`` reads it: ``always``, or a duration in
    seconds or milliseconds (in a nats config a bare ``2m`` is the number 2,000,000, not two minutes)."""
    text = value.strip().lower()
    if text == "always":
        return text
    match = _DURATION.match(text)
    if match is None or int(match.group(1)) == 0:
        raise ValueError(f"{value!r} is neither 'always' nor a duration such as 500ms, 1s, 2m or 1h")
    seconds = int(match.group(1)) * _DURATION_S[match.group(2)]
    return f"{match.group(1)}ms" if match.group(2) == "ms" else f"{int(seconds)}s"


class BusSettings(BaseModel):
    # --- bus -------------------------------------------------------------------------
    nats_url: str = Field("nats://127.0.0.1:4222", validation_alias=AliasChoices("LW_NATS_URL", "NATS_URL"))
    nats_sync_interval: str | None = Field(
        None,
        description="JetStream's fsync, written into the nats-server config loopwarden starts or ships: 'always' "
        "(every write is on disk before its ack: survives a power loss) or a duration such as 1s or 2m (acked "
        "writes since the last sync survive a process crash, not a power loss); unset: the server's 2 minutes "
        "(docs/operations.md, Durability)",
    )
    nats_user: str | None = None
    nats_password: SecretStr | None = None
    ack_wait_s: float = Field(
        30.0,
        gt=0,
        description="JetStream ack wait; handlers heartbeat at a third of it, and a handler whose dependency is not "
        "ready (the governor restarting) retries in place until it has passed since the delivery, then hands it back",
    )
    max_deliver: int = Field(
        6,
        ge=2,
        description="deliveries before a message is dead-lettered (a crash or hang each; an outage one per ack wait; "
        "a wait on a replica that shows it is alive, such as a tool call another executor runs, none)",
    )
    redeliver_delay_s: float = Field(0.5, ge=0, description="first nack delay; doubles per delivery")
    duplicate_window_s: float = Field(
        600.0,
        gt=0,
        description="JetStream de-duplication window of LW_SUBMIT: what a client or an operator may send again "
        "(a submit, a requeue)",
    )
    redelivery_window_s: float | None = Field(
        None,
        gt=0,
        description="de-duplication window of LW_CMD, LW_EVT and LW_DLQ, whose messages are published again only "
        "by a redelivered handler: default the delivery budget (max_deliver ack waits and the nak backoffs between "
        "them), at least 120 s. nats-server holds every message id of the window in memory",
    )
    tool_lease_s: float = Field(
        10.0,
        gt=0,
        description="an executor's lease on a tool call it runs (renewed at a fifth of it): another replica "
        "declares the call's outcome unknown only after seeing no renewal for this long",
    )
    stream_max_age_s: float = Field(7 * 24 * 3600.0, gt=0)
    rpc_timeout_s: float = Field(5.0, gt=0)
    manage_streams: bool = Field(
        True, description="create/update streams and buckets at start; off where an admin bootstraps them"
    )
    stream_replicas: int = Field(1, ge=1, le=5, description="JetStream replicas for streams and buckets")
    max_in_flight: int = Field(
        64, ge=1, le=10_000, description="messages a replica handles at once per durable consumer (I/O-bound work)"
    )
    max_in_flight_by_service: dict[str, PositiveInt] = Field(
        default_factory=dict, description='JSON: per-service override of LW_MAX_IN_FLIGHT, e.g. {"executor": 256}'
    )
    dispatch_lookahead: int | None = Field(
        None,
        ge=0,
        le=10_000,
        description="messages a replica holds per durable beyond its free slots, waiting for one: a slot that frees "
        "goes to the tenant served least (weighted), so another tenant's backlog fetched first does not delay it "
        "(None: as many as LW_MAX_IN_FLIGHT; 0: fetch for free slots only, first come first served)",
    )
    dispatch_headroom: float = Field(
        0.25,
        ge=0,
        le=1,
        description="share of LW_MAX_IN_FLIGHT a replica may run past it for tenants below their share of a durable's "
        "slots: their messages start at once rather than waiting for another tenant's handlers to end",
    )
    dispatch_yield: bool = Field(
        False,
        description="while another tenant has messages running in a durable, a tenant holding its share of the "
        "slots takes no more as they free (fewer of a backlog's handlers beside another tenant's)",
    )
    dispatch_commits: int = Field(
        6,
        ge=0,
        le=10_000,
        description="a planner replica's commits at once (saving a run after a message or a model turn and "
        "publishing what it produced), given to tenants by fair share as slots are: a backlog's turns that end "
        "together no longer take the CPU another tenant's commit needs (0: no bound)",
    )
    event_loop: Literal["uvloop", "asyncio"] = Field(
        "uvloop", description="a service's event loop: uvloop (libuv; less CPU per message) or the standard asyncio one"
    )
    max_ack_pending: int | None = Field(
        None, ge=1, description="unacked messages per durable across its replicas (default: 8 x max in flight)"
    )
    bucket_replicas: int | None = Field(
        None, ge=1, le=5, description="JetStream replicas for KV buckets (default: LW_STREAM_REPLICAS)"
    )
    failover_retry_s: float = Field(
        20.0, ge=0, description="how long a publish or KV request rides out a stream leader election"
    )
    js_timeout_s: float = Field(
        5.0, gt=0, description="how long one JetStream publish or KV request waits for its answer before a retry"
    )
    infra_wait_s: float = Field(
        0, ge=0, description="with LW_MANAGE_STREAMS=false: give up waiting for bootstrap after this long (0: never)"
    )
    stack_ready_timeout_s: float = Field(
        60.0,
        gt=0,
        description="how long a local stack (`loopwarden up`, `demo`, the test suite) waits for nats-server and "
        "every service to be ready before it stops what it started and fails",
    )

    @field_validator("nats_url")
    @classmethod
    def _nats_scheme(cls, v: str) -> str:
        for url in v.split(","):
            if not url.strip().startswith(("nats://", "tls://", "ws://", "wss://")):
                raise ValueError(f"must start with nats://, tls://, ws:// or wss:// (got {url!r})")
        return v

    @field_validator("nats_sync_interval")
    @classmethod
    def _sync_interval(cls, v: str | None) -> str | None:
        return None if v is None else sync_interval(v)

    @property
    def delivery_budget_s(self) -> float:
        """How long after its first delivery a message can still be handled (and what it publishes published
        again): ``max_deliver`` ack waits and the doubling nak delays between them."""
        naks = self.redeliver_delay_s * ((1 << (self.max_deliver - 1)) - 1)
        return self.max_deliver * self.ack_wait_s + naks

    @property
    def redelivery_dedupe_s(self) -> float:
        """The de-duplication window of the streams only redeliveries publish to again."""
        return self.redelivery_window_s or max(120.0, self.delivery_budget_s)

    @property
    def kv_replicas(self) -> int:
        """Replicas of a KV bucket: ``LW_BUCKET_REPLICAS``, else ``LW_STREAM_REPLICAS``."""
        return self.bucket_replicas or self.stream_replicas

    def in_flight_for(self, service: str) -> int:
        """How many messages one replica of ``service`` handles at once."""
        return max(1, self.max_in_flight_by_service.get(service, self.max_in_flight))

    def lookahead_for(self, service: str) -> int:
        """How many messages one replica of ``service`` holds per durable beyond its free slots."""
        if self.dispatch_lookahead is not None:
            return self.dispatch_lookahead
        return self.in_flight_for(service)

    def ack_pending_for(self, service: str) -> int:
        """A durable's ``max_ack_pending``: room for up to eight replicas each at full concurrency."""
        return self.max_ack_pending or 8 * self.in_flight_for(service)
