"""How many NATS operations of each kind this process made: cheap counters (one dict increment
per operation) that a benchmark reads to say what a step costs (``make bench``, docs/benchmarks.md).

Counted where the bus sends, by what the subject says the operation is:

* ``publish`` - a JetStream publish awaited for its PubAck (a stream message: command or event);
* ``kv_put`` - a KV write (plain or compare-and-swap), awaited for its PubAck;
* ``kv_get`` - a KV read by direct get; ``direct_get`` - any other stream read by direct get
  (a dead letter, a run's events);
* ``rpc`` - a core request/reply (the governor's budget, a tenant's read);
* ``payload_put`` / ``payload_fetch`` - a claim-check body's chunk stored or fetched;
* ``js_api`` - any other JetStream API request (consumer info, stream info);
* ``remove`` - a handled message deleted from its stream (a submit once its run is recorded, a run's commands
  once it ended: ``services/planner/removals.py``), in the background, awaited by no handler;
* ``pull`` - a pull request on a durable; ``delivered`` - a message a durable delivered to a handler
  (acknowledged or handed back once it is handled).

The first eight are round trips a handler awaits (``ROUND_TRIPS``); ``remove`` is clean-up after the fact,
counted apart (``CLEAN_UP``); ``pull`` and ``delivered`` are the two halves of a
delivery (a hand-off through the server), counted apart. Here, not in ``shared/bus/``: the claim-check
store (``shared/payloads.py``) counts too, and the bus imports it. ``dump`` writes them for a benchmark: on
``SIGUSR1`` when ``LW_OP_COUNTS_DIR`` is set (``shared/service.py``).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

from shared.subjects import PAYLOAD_PREFIX, STREAM_PAYLOADS

ROUND_TRIPS = ("publish", "kv_put", "kv_get", "direct_get", "rpc", "payload_put", "payload_fetch", "js_api")
CLEAN_UP = ("remove",)
DELIVERIES = ("pull", "delivered")
KINDS = ROUND_TRIPS + CLEAN_UP + DELIVERIES

COUNTS: Counter[str] = Counter()
"""This process's counts by kind (every ``Bus`` of the process adds to it)."""

_DIRECT_GET = "$JS.API.DIRECT.GET."


def kind_of(subject: str) -> str:
    """The kind of operation a request on ``subject`` is."""
    if subject.startswith("$KV."):
        return "kv_put"
    if subject.startswith(_DIRECT_GET):
        rest = subject[len(_DIRECT_GET) :]
        if rest.startswith("KV_"):
            return "kv_get"
        return "payload_fetch" if rest.startswith(STREAM_PAYLOADS + ".") else "direct_get"
    if subject.startswith("$JS.API.CONSUMER.MSG.NEXT."):
        return "pull"
    if subject.startswith("$JS.API.STREAM.MSG.DELETE."):
        return "remove"
    if subject.startswith("$JS."):
        return "js_api"
    if subject.startswith(PAYLOAD_PREFIX + "."):
        return "payload_put"
    return "publish"


def note(subject: str) -> None:
    """One request on ``subject`` was sent."""
    COUNTS[kind_of(subject)] += 1


def count(kind: str, n: int = 1) -> None:
    COUNTS[kind] += n


def dump(directory: str, service: str) -> Path:
    """Write this process's counts to ``<directory>/<service>-<pid>.json`` (replaced whole) and return the path."""
    path = Path(directory) / f"{service}-{os.getpid()}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"service": service, "pid": os.getpid(), "counts": dict(COUNTS)}))
    tmp.replace(path)
    return path
