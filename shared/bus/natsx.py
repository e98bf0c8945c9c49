"""Every private name of nats-py the project reaches for, in one place (nats-py is pinned: 2.16.0).

The bus writes ``HPUB`` by hand on the hot path, reads KV keys by direct get through its own reply
collector and lets a CLI command hear the server's asynchronous ``-ERR``; each needs something nats-py
keeps private. Nothing else in the tree touches a private nats-py name: it calls these.
``tests/repo/test_natsx.py`` checks them against the installed nats-py, so an upgrade that renames or
drops one fails there, naming it, instead of at run time.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from nats.aio.client import _HEADER_KEY_RE, _SUBJECT_INVALID_RE
from nats.aio.client import Client as NatsClient
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue, _is_key_valid

ErrorCallback = Callable[[Exception], Awaitable[None]]

# (owner, private name) pairs used below: what the test checks on the installed nats-py.
PRIVATE_NAMES: tuple[tuple[str, str], ...] = (
    ("nats.aio.client", "_HEADER_KEY_RE"),
    ("nats.aio.client", "_SUBJECT_INVALID_RE"),
    ("nats.js.kv", "_is_key_valid"),
    ("Client", "_status"),
    ("Client", "_max_payload"),
    ("Client", "_flush_queue"),
    ("Client", "_send_command"),
    ("Client", "_flush_pending"),
    ("Client", "_pending_data_size"),
    ("Client", "_pending"),
    ("Client", "_error_cb"),
    ("JetStreamContext", "_prefix"),
    ("KeyValue", "_pre"),
    ("KeyValue", "_stream"),
    ("KeyValue", "_direct"),
)


# --- the connection ----------------------------------------------------------------------------------
def is_connected(nc: NatsClient) -> bool:
    """Connected now (not connecting, reconnecting, draining or closed): a raw write reaches the socket."""
    return bool(nc._status == NatsClient.CONNECTED)


def max_payload(nc: NatsClient) -> int:
    """The largest message body the server accepts (from its INFO)."""
    return int(nc._max_payload)


async def send_command(nc: NatsClient, command: bytes) -> None:
    """Write a protocol command as ``nc.publish`` does, flushing when nothing else is queued."""
    await send_with_next_write(nc, command)
    if nc._flush_queue is not None and nc._flush_queue.empty():
        await flush(nc)


async def send_with_next_write(nc: NatsClient, command: bytes) -> None:
    """Queue a protocol command without waking nats-py's flusher: it goes out with the next write of
    the connection (the caller ``flush``-es when none comes: ``unwritten``, ``unwritten_batch``)."""
    await nc._send_command(command)


def unwritten(nc: NatsClient) -> bool:
    """Something is queued that the connection has not written yet (and it is up: a closing one writes it)."""
    return nc._pending_data_size > 0 and is_connected(nc)


def unwritten_batch(nc: NatsClient) -> object:
    """What is queued now, as one batch: the same object until a write takes it (nats-py starts a new list)."""
    batch: object = nc._pending
    return batch


async def flush(nc: NatsClient) -> None:
    """Write what is queued now (wakes nats-py's flusher, as a publish does)."""
    await nc._flush_pending()


def error_callback(nc: NatsClient) -> ErrorCallback:
    """The callback nats-py calls with asynchronous server errors (``-ERR``, e.g. a permissions violation)."""
    cb: ErrorCallback = nc._error_cb
    return cb


def set_error_callback(nc: NatsClient, cb: ErrorCallback) -> None:
    nc._error_cb = cb


# --- the protocol's rules, as nats-py applies them ---------------------------------------------------
def header_name_ok(name: str) -> bool:
    """Whether nats-py takes ``name`` as a header name (it checks each one on every publish)."""
    return _HEADER_KEY_RE.fullmatch(name) is not None


def subject_invalid(subject: str) -> bool:
    """Whether nats-py refuses ``subject`` (whitespace in it)."""
    return _SUBJECT_INVALID_RE.search(subject) is not None


def key_valid(key: str) -> bool:
    """Whether ``key`` is a valid KV key (nats-py's rule)."""
    return bool(_is_key_valid(key))


# --- JetStream and buckets ---------------------------------------------------------------------------
def api_prefix(js: JetStreamContext) -> str:
    """The JetStream API prefix (``$JS.API``, or a domain's)."""
    return str(js._prefix)


def kv_subject_prefix(kv: KeyValue) -> str:
    """The subject prefix a bucket's keys are stored under (``$KV.<bucket>.``)."""
    return str(kv._pre)


def kv_stream(kv: KeyValue) -> str:
    """The stream that holds a bucket (``KV_<bucket>``)."""
    return str(kv._stream)


def kv_direct(kv: KeyValue) -> bool:
    """Whether the bucket allows direct gets."""
    return bool(kv._direct)
