"""The one bus helper, behind one face: ``from shared.bus import Bus, ...`` as before the split.

The parts, one concept each (laid out as ``temporalio/converter`` is, re-exported here):

- ``connection``: ``Bus`` itself - settings, the connection and its callbacks, connect/start/stop;
  it composes the parts below, each a layer that stands on ``core``.
- ``core``: what every part uses - the shared state, riding out a failover, tracing, decoding.
- ``wire``: header names, contract decoding, subject limits, the ``HPUB`` fast path, PubAcks.
- ``replies``: one inbox subscription collecting the answers to JetStream requests.
- ``publishing``: JetStream publishes, one or a batch, resent with their ids across a failover.
- ``letters``: dead letters, written and read back.
- ``requests``: core NATS responders and requests.
- ``gate``: a replica's sections of work given places by tenant, as fair dispatch gives slots.
- ``pulls``: driving a durable pull consumer on nats-py; ``consuming``: registering and delivering.
- ``requeue``: a dead letter handed back runs once more through its consumer.
- ``kv``: buckets (direct-get reads, compare-and-swap writes, claim-checked values).
- ``scans``: reading a stream without a consumer (batched direct gets).
- ``infra``: declared streams, buckets and consumers; waiting until they exist.
- ``errors``: what the bus raises.
"""

from __future__ import annotations

from shared.bus.connection import Bus
from shared.bus.consuming import MIN_RETRY_S, current_deliveries, current_seq, current_subject
from shared.bus.declared import Declaration, declarations
from shared.bus.errors import (
    CasConflict,
    InfrastructureNotReady,
    RequestRefused,
    StreamFull,
    SubjectTooLong,
    TryLater,
    Undecodable,
    describe_nats_error,
)
from shared.bus.gate import FairGate
from shared.bus.infra import (
    KV_HISTORY,
    KV_MAX_AGE_S,
    BoundTooSmall,
    ConsumerSpec,
    consumer_config,
    consumer_drift,
    ensure_buckets,
    ensure_consumers,
    ensure_streams,
    kv_history,
    needed_buckets,
    stream_config,
    until_ready,
)
from shared.bus.kv import Unchanged, kv_keys
from shared.bus.pulls import PULL_EXPIRES_S, Handler
from shared.bus.requeue import RequeueClaim
from shared.bus.scans import SCAN_BATCH, SCAN_MAX_BYTES, Stored, kv_scan, scan, scan_all, scan_page
from shared.bus.wire import (
    EXPECTED_LAST_SUBJECT_SEQUENCE_HEADER,
    EXPECTED_STREAM_HEADER,
    INBOX_PREFIXES,
    KV_OP_HEADER,
    LW_RUN_ID_ATTR,
    MAX_SUBJECT,
    MSG_ID_HEADER,
    RUN_ID_HEADER,
    TENANT_HEADER,
    TENANT_WEIGHT_HEADER,
    WRONG_LAST_SEQUENCE,
    ack_consumer,
    check_subject,
    current_tenant,
    decode,
    landed_where_expected,
    num_delivered,
    pub_ack,
    publish_raw,
    tenant_of,
    tenant_scope,
)

__all__ = [
    "EXPECTED_LAST_SUBJECT_SEQUENCE_HEADER",
    "EXPECTED_STREAM_HEADER",
    "INBOX_PREFIXES",
    "KV_HISTORY",
    "KV_MAX_AGE_S",
    "KV_OP_HEADER",
    "LW_RUN_ID_ATTR",
    "MAX_SUBJECT",
    "MIN_RETRY_S",
    "MSG_ID_HEADER",
    "PULL_EXPIRES_S",
    "RUN_ID_HEADER",
    "SCAN_BATCH",
    "SCAN_MAX_BYTES",
    "TENANT_HEADER",
    "TENANT_WEIGHT_HEADER",
    "WRONG_LAST_SEQUENCE",
    "BoundTooSmall",
    "Bus",
    "CasConflict",
    "ConsumerSpec",
    "Declaration",
    "FairGate",
    "Handler",
    "InfrastructureNotReady",
    "RequestRefused",
    "RequeueClaim",
    "Stored",
    "StreamFull",
    "SubjectTooLong",
    "TryLater",
    "Unchanged",
    "Undecodable",
    "ack_consumer",
    "check_subject",
    "consumer_config",
    "consumer_drift",
    "current_deliveries",
    "current_seq",
    "current_subject",
    "current_tenant",
    "declarations",
    "decode",
    "describe_nats_error",
    "ensure_buckets",
    "ensure_consumers",
    "ensure_streams",
    "kv_history",
    "kv_keys",
    "kv_scan",
    "landed_where_expected",
    "needed_buckets",
    "num_delivered",
    "pub_ack",
    "publish_raw",
    "scan",
    "scan_all",
    "scan_page",
    "stream_config",
    "tenant_of",
    "tenant_scope",
    "until_ready",
]
