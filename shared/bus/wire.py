"""The wire format: header names, decoding into a contract, subjects' limits, the hand-written
``HPUB`` fast path, PubAcks and what a JetStream ack subject says."""

from __future__ import annotations

import contextlib
import contextvars
import json
from collections.abc import Iterator
from typing import Any, TypeVar

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js.errors import (
    APIError,
    KeyWrongLastSequenceError,
    NoStreamResponseError,
)
from pydantic import BaseModel, ValidationError

from shared import subjects as S
from shared.bus import natsx
from shared.bus.errors import STREAM_FULL, StreamFull, SubjectTooLong, Undecodable
from shared.describe import describe

M = TypeVar("M", bound=BaseModel)

RUN_ID_HEADER = "Lw-Run-Id"
MSG_ID_HEADER = "Nats-Msg-Id"
LW_RUN_ID_ATTR = "loopwarden.run.id"
KV_OP_HEADER = "KV-Operation"
EXPECTED_STREAM_HEADER = "Nats-Expected-Stream"  # not sent: ``landed_where_expected`` reads the PubAck
EXPECTED_LAST_SUBJECT_SEQUENCE_HEADER = "Nats-Expected-Last-Subject-Sequence"
WRONG_LAST_SEQUENCE = (10071, 10164)  # JetStream err_codes of a failed compare-and-swap
# Whose work a message is (the run's tenant) and that tenant's weight: what a consumer's fair dispatch orders
# by (``fair.py``). The planner sets it on what it publishes for a run; every other service's messages carry on
# the tenant of the message being handled. A scheduling hint only: nothing is allowed or refused by it.
TENANT_HEADER = "Lw-Tenant"
TENANT_WEIGHT_HEADER = "Lw-Tenant-Weight"
_TENANT: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar("lw_tenant", default=None)


@contextlib.contextmanager
def tenant_scope(tenant: str | None, weight: float = 1.0) -> Iterator[None]:
    """Messages published inside carry ``tenant`` (and its weight unless 1) in their headers."""
    token = _TENANT.set((tenant, "" if weight == 1 else f"{weight:g}") if tenant else None)
    try:
        yield
    finally:
        _TENANT.reset(token)


def tenant_headers(headers: dict[str, str]) -> None:
    """Add the current tenant (``tenant_scope``, or the message being handled) to an outgoing message's headers."""
    current = _TENANT.get()
    if current is not None:
        headers[TENANT_HEADER] = current[0]
        if current[1]:
            headers[TENANT_WEIGHT_HEADER] = current[1]


def current_tenant() -> tuple[str, float]:
    """The tenant of the message being handled (or of ``tenant_scope``; "" for none) and its weight."""
    current = _TENANT.get()
    return (current[0], _weight(current[1])) if current is not None else ("", 1.0)


def tenant_of(headers: dict[str, str] | None) -> tuple[str, float]:
    """The tenant a received message's headers name ("" for none) and its weight (1 unless a positive number)."""
    if not headers:
        return "", 1.0
    return headers.get(TENANT_HEADER, ""), _weight(headers.get(TENANT_WEIGHT_HEADER))


def _weight(text: str | None) -> float:
    try:
        weight = float(text or 1.0)
    except ValueError:
        return 1.0
    return weight if 0 < weight < 1e6 else 1.0


def handling(headers: dict[str, str] | None) -> contextvars.Token[tuple[str, str] | None]:
    """While a received message is handled, what its handler publishes carries on its tenant (``_TENANT.reset``)."""
    tenant = headers.get(TENANT_HEADER) if headers else None
    weight = (headers or {}).get(TENANT_WEIGHT_HEADER, "")
    return _TENANT.set((tenant, weight) if tenant else None)


def handled(token: contextvars.Token[tuple[str, str] | None]) -> None:
    _TENANT.reset(token)


def decode(model: type[M], data: bytes) -> M:
    """``data`` as ``model``, or ``Undecodable`` with a one-line reason - whatever the body is
    (not UTF-8, not JSON, nested beyond any parser's depth, or not the contract)."""
    try:
        return model.model_validate_json(data)
    except ValidationError as err:
        raise Undecodable(f"does not match contract {model.__name__}: {describe(err)}") from None
    except RecursionError:
        raise Undecodable(f"does not decode as {model.__name__}: nested too deeply") from None
    except Exception as err:
        raise Undecodable(f"does not decode as {model.__name__}: {type(err).__name__}: {err}") from None


_HEADER_KEYS_OK: set[str] = set()  # header names already checked against nats-py's rule
# nats-server closes a connection whose control line passes 4 KiB (``max_control_line``) and nats-py does
# not reconnect: a subject this long is refused here, before it reaches the wire (``S.token`` and
# ``S.kv_key`` bound what they build; this catches whatever else a client managed to get into one).
MAX_SUBJECT = 2048
# Where answers go: a user's own inbox prefix (``_INBOX_<user>``, what the grants name) or nats-py's default
INBOX_PREFIXES = ("_INBOX_", "_INBOX.")


def check_subject(subject: str, reply: str = "") -> None:
    if len(subject) + len(reply) > MAX_SUBJECT:
        raise SubjectTooLong(f"subject of {len(subject)} characters ({subject[:60]}...) is over {MAX_SUBJECT}")


async def publish_raw(nc: NatsClient, subject: str, body: bytes, reply: str, headers: dict[str, str] | None) -> None:
    """``nc.publish`` with the header block written in one go: nats-py checks every header name with a
    regular expression and builds the block piece by piece on every publish (about 9 us of 13 for four
    headers). Same bytes on the wire; whatever the fast path does not cover - a header name not seen
    yet that fails nats-py's rule, a value with a line break, an empty subject or one with whitespace,
    a body over the server's limit, a connection not connected (reconnect buffering) - goes through
    ``nc.publish`` itself, which raises or rewrites as it always does."""
    check_subject(subject, reply)
    if (
        not headers
        or not natsx.is_connected(nc)
        or not subject
        or len(body) > natsx.max_payload(nc)
        or natsx.subject_invalid(subject)
    ):
        await nc.publish(subject, body, reply=reply, headers=headers or None)  # no headers: no header block
        return
    for key in headers:
        if key not in _HEADER_KEYS_OK:
            if not natsx.header_name_ok(key):
                await nc.publish(subject, body, reply=reply, headers=headers)
                return
            _HEADER_KEYS_OK.add(key)
    values = "".join(headers.values())
    if "\r" in values or "\n" in values:
        await nc.publish(subject, body, reply=reply, headers=headers)
        return
    hdr = ("NATS/1.0\r\n" + "".join([f"{k}: {v.strip()}\r\n" for k, v in headers.items()]) + "\r\n").encode()
    total = len(hdr) + len(body)
    nc.stats["out_msgs"] += 1
    nc.stats["out_bytes"] += len(body)
    control = f"HPUB {subject} {reply} {len(hdr)} {total}\r\n".encode()
    await natsx.send_command(nc, b"".join((control, hdr, body, b"\r\n")))


class _PubAck:
    """What the bus needs of a PubAck: the stored sequence and whether it was a duplicate."""

    __slots__ = ("duplicate", "seq", "stream")

    def __init__(self, stream: str, seq: int, duplicate: bool) -> None:
        self.stream, self.seq, self.duplicate = stream, seq, duplicate


def pub_ack(msg: Msg) -> _PubAck:
    """The PubAck in ``msg``, or the error it carries raised as nats-py raises it: no stream listening
    -> ``NoStreamResponseError``, a failed compare-and-swap -> ``KeyWrongLastSequenceError``, any other
    JetStream error -> its ``APIError`` (503 -> ``ServiceUnavailableError``)."""
    if not msg.data:
        status = msg.headers.get("Status") if msg.headers else None
        if status == "503":
            raise NoStreamResponseError
        if status:
            APIError.from_msg(msg)
    try:
        resp = json.loads(msg.data)
    except ValueError as err:
        raise APIError(description=f"unreadable PubAck: {msg.data[:200]!r}") from err
    error = resp.get("error")
    if error is not None:
        try:
            APIError.from_error(error)
        except APIError as api_error:
            if api_error.err_code in WRONG_LAST_SEQUENCE:
                raise KeyWrongLastSequenceError(description=api_error.description) from None
            if api_error.err_code == STREAM_FULL:  # not an outage: sending it again would not store it
                raise StreamFull(
                    code=api_error.code, err_code=api_error.err_code, description=api_error.description
                ) from None
            raise
        raise APIError(description=str(error))  # from_error always raises
    return _PubAck(resp.get("stream", ""), int(resp.get("seq", 0)), bool(resp.get("duplicate", False)))


def _ack_token(reply: str | None, at: int) -> str | None:
    """Token ``at`` of a JetStream ack subject as ``Msg.metadata`` reads it: ``$JS.ACK.<stream>.<consumer>.
    <delivered>.<stream seq>.<consumer seq>.<stored ns>.<pending>`` (9 tokens), or the same two tokens further
    with domain and account hash (11 or more); None for anything else (a core NATS request)."""
    tokens = reply.split(".") if reply else []
    if len(tokens) < 9 or tokens[0] != "$JS" or tokens[1] != "ACK" or len(tokens) == 10:
        return None
    return tokens[at] if len(tokens) == 9 else tokens[at + 2]


def num_delivered(reply: str | None) -> int:
    """How often a JetStream message was delivered, read from its ack subject without building the whole
    metadata; 1 for anything else."""
    token = _ack_token(reply, 4)
    return int(token) if token is not None and token.isdigit() else 1


def stored_age_s(reply: str | None, now_ns: int) -> float | None:
    """How long ago a JetStream message was stored, read from its ack subject; None for anything else."""
    token = _ack_token(reply, 7)
    if token is None or not token.isdigit():
        return None
    return max(0.0, (now_ns - int(token)) / 1e9)


# How many deliveries past ``LW_MAX_DELIVER`` a consumer makes (``consumer_config``): room for a message handed
# back at once rather than crashed on. nats-server gives a message handed back to the next waiting pull request,
# round robin, so a stopping replica of release 0.31 (which nak'd at once what its open pull requests still
# brought) burns one delivery per request it had open before a live replica's request takes it.
HANDED_BACK_MARGIN = 16


def last_delivery(limit: int) -> int:
    """The consumer's ``max_deliver``: past it nats-server delivers the message no more."""
    return limit + HANDED_BACK_MARGIN


def hung_every_time(deliveries: int, limit: int, age_s: float | None, ack_wait_s: float) -> bool:
    """Whether a message on its ``deliveries``-th delivery is dead-lettered before it runs again, as one that
    crashed its process or hung on each of ``limit`` deliveries. Such a delivery ends only when the ack wait
    runs out, so they take ``limit`` ack waits at least; a message past the limit that came back sooner was
    handed back (a nak) and runs again. The consumer's last delivery is dead-lettered whatever its age, so
    nothing is left undelivered in silence."""
    if deliveries <= limit:
        return False
    if deliveries >= last_delivery(limit) or age_s is None:
        return True
    return age_s >= limit * ack_wait_s


def ack_consumer(reply: str | None) -> str | None:
    """The durable consumer a JetStream message was delivered by, read from its ack subject; None for anything
    else (a core NATS request)."""
    return _ack_token(reply, 3)


def _stream_seq(raw: Any) -> int:
    try:
        return int(raw.metadata.sequence.stream)
    except Exception:
        return 0


def landed_where_expected(subject: str, ack: _PubAck) -> _PubAck:
    """``ack`` if the stream that stored the publish is the one whose subjects hold ``subject``; else an
    ``APIError`` naming both (a stream of another deployment taking our subjects: a misconfiguration).

    What ``js.publish(stream=)`` asks of the server with a ``Nats-Expected-Stream`` header, checked on the PubAck
    instead: the header is stored with every message (30 bytes each, 24 messages a demo run), the PubAck names
    the stream anyway. A bucket's key (``$KV.``) is in no stream of ours: not looked up (each key its own
    subject, none cached)."""
    if subject.startswith("$KV."):
        return ack
    expected = S.stream_for(subject)
    if expected is not None and ack.stream and ack.stream != expected:
        raise APIError(description=f"{subject} was stored in stream {ack.stream}, not {expected}: check the streams")
    return ack
