"""The one bus helper: broker, streams, consumers, buckets, publishing, dead letters.

Handlers stay thin: ``Bus.consumer`` decodes the message into its contract, dead-letters
what does not fit (with the reason), heartbeats every message it holds, acks only after the
handler returned (its effects are durable by then), and dead-letters a message that keeps
failing - or that never completes because its handler kills the process - instead of letting
it block the consumer or vanish.

Concurrency: the bus drives each durable pull consumer on nats-py itself (FastStream 0.7.8's
``max_workers`` pull subscriber fetches with ``fetch(batch)``, whose lingering request holds a
first message until the batch fills or the request expires, and passes each message through
its dependency injection with a thread hop). Pull requests ask for as many messages as there
are free slots (``LW_MAX_IN_FLIGHT`` per consumer); each message runs as its own task, under a
lock per run id (the ``Lw-Run-Id`` header) so one run's messages are handled one after another
in a replica while different runs overlap. On stop, nothing new is taken, in-flight handlers get
a grace period and what does not finish is handed back (nak) at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import functools
import itertools
import json
import logging
import random
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

from faststream.nats import NatsBroker, NatsUserPassword
from nats.aio.client import _HEADER_KEY_RE, _SUBJECT_INVALID_RE
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import (
    AckPolicy as JsAckPolicy,
)
from nats.js.api import (
    ConsumerConfig,
    DeliverPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.client import JetStreamContext
from nats.js.errors import (
    APIError,
    BadRequestError,
    BucketNotFoundError,
    InvalidKeyError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NoStreamResponseError,
    NotFoundError,
    ServiceUnavailableError,
)
from nats.js.kv import KeyValue, _is_key_valid
from opentelemetry import context as otel_context
from opentelemetry import propagate
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind, Tracer
from pydantic import BaseModel, ValidationError

from shared import subjects as S
from shared.dead_letters import NoSuchLetter, NotRequeueable, carried_headers, letter_body, not_ours, taker
from shared.describe import describe
from shared.messages import DeadLetter, ErrorReply, Requeue
from shared.payloads import PayloadError, PayloadStore, PayloadTooLarge
from shared.payloads import stream_config as payload_stream_config
from shared.permissions import GRANTS, streams_seen
from shared.scenario import Scenario
from shared.settings import Settings

log = logging.getLogger("loopwarden.bus")
M = TypeVar("M", bound=BaseModel)
R = TypeVar("R")
Handler = Callable[[M], Awaitable[None]]

RUN_ID_HEADER = "Lw-Run-Id"
MSG_ID_HEADER = "Nats-Msg-Id"
LW_RUN_ID_ATTR = "loopwarden.run.id"
SCENARIOS_KEPT = 256  # scripted runs whose scenario a process keeps in memory
PULL_EXPIRES_S = 5.0  # a pull request's lifetime; a new one is sent as slots free up
MIN_RETRY_S = 0.1  # the shortest wait before a handler that said "try later" is tried again in place
KV_OP_HEADER = "KV-Operation"
EXPECTED_STREAM_HEADER = "Nats-Expected-Stream"
EXPECTED_LAST_SUBJECT_SEQUENCE_HEADER = "Nats-Expected-Last-Subject-Sequence"
WRONG_LAST_SEQUENCE = (10071, 10164)  # JetStream err_codes of a failed compare-and-swap
_DELIVERIES: contextvars.ContextVar[int] = contextvars.ContextVar("lw_deliveries", default=1)


def current_deliveries() -> int:
    """How many times the message the running handler works on has been delivered (1 = first)."""
    return _DELIVERIES.get()


_SUBJECT: contextvars.ContextVar[str] = contextvars.ContextVar("lw_subject", default="")


def current_subject() -> str:
    """The subject the message the running handler works on arrived on (an identity token the server's
    permissions guarantee, e.g. the tenant of ``cmd.run.submit.<tenant>``)."""
    return _SUBJECT.get()


class TryLater(Exception):
    """Raised by a handler whose dependency is not ready: try again after ``delay``, in place (the
    message held) while the ack wait lasts; ``in_place=False`` hands the message back at once, for a
    wait that must not hold one of the consumer's slots (one tool's missing contract would otherwise
    stall every other tool's results)."""

    def __init__(self, reason: str, delay: float = 0.5, *, in_place: bool = True) -> None:
        super().__init__(reason)
        self.delay = delay
        self.in_place = in_place


class CasConflict(Exception):
    """The key changed since it was read; reload and apply again."""


class RequestRefused(Exception):
    """The service answered a request with an ``ErrorReply`` (the request was dead-lettered)."""


class Undecodable(Exception):
    """A message body that does not decode into its contract (the reason names why)."""


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


class InfrastructureNotReady(RuntimeError):
    """A stream, bucket or consumer this process needs is still missing after ``LW_INFRA_WAIT_S``."""


class RequeueClaim(BaseModel):
    """``lw_requeues/<service>.<letter>``: the requeue command that took the letter back (once)."""

    letter: int
    requeue_seq: int


@dataclass(frozen=True)
class ConsumerSpec:
    stream: str
    durable: str
    filter_subjects: tuple[str, ...]
    service: str = ""  # whose durable: its max_ack_pending follows that service's concurrency


@dataclass
class _Responder:
    subject: str
    model: type[Any]
    handler: Callable[..., Awaitable[BaseModel]]
    reply: Callable[[str], BaseModel]
    with_subject: bool = False  # the handler also gets the subject the request arrived on


class _RunLocks:
    """One lock per run id, dropped when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    async def acquire(self, key: str) -> None:
        """Take the run's lock (``release`` it after); ``hold`` without a context manager per message."""
        lock, users = self._locks.get(key, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._locks[key] = (lock, users + 1)
        try:
            await lock.acquire()
        except BaseException:  # cancelled while waiting
            self._drop(key)
            raise

    def release(self, key: str) -> None:
        self._locks[key][0].release()
        self._drop(key)

    def _drop(self, key: str) -> None:
        lock, users = self._locks[key]
        if users <= 1:
            del self._locks[key]
        else:
            self._locks[key] = (lock, users - 1)


class _Pull:
    """One durable pull consumer driven directly on nats-py: pull requests ask for as many
    messages as there are free slots; each delivered message runs as its own task."""

    def __init__(self, bus: Bus, spec: ConsumerSpec, model: type[Any], handler: Handler[Any]) -> None:
        self.bus, self.spec, self.model, self.handler = bus, spec, model, handler
        self.limit = bus.settings.in_flight_for(bus.service)
        self.held: dict[int, Msg] = {}  # id(msg) -> msg (nats-py messages are not hashable)
        self.tasks: set[asyncio.Task[None]] = set()
        self.pending = 0  # messages asked for and not yet delivered
        self.requests: deque[float] = deque()  # expiry time of each live pull request
        self.wake = asyncio.Event()
        self.stopping = False
        self.sub: Subscription | None = None
        self.loop_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        nc = self.bus.nc
        self.inbox = nc.new_inbox()  # under this service's inbox prefix (permissions)
        self.next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{self.spec.stream}.{self.spec.durable}"
        self.sub = await nc.subscribe(self.inbox, cb=self.on_msg)
        self.loop_task = asyncio.create_task(self.loop(), name=f"pull {self.spec.durable}")

    async def on_msg(self, msg: Msg) -> None:
        try:
            await self._on_msg(msg)
        except Exception:  # nats-py would swallow it silently
            log.exception("%s: could not take a message on %s", self.bus.service, self.spec.durable)

    async def _on_msg(self, msg: Msg) -> None:
        status = msg.headers.get("Status") if msg.headers else None
        if status:
            if status == "100":  # idle heartbeat
                return
            left = msg.headers.get("Nats-Pending-Messages") if msg.headers else None
            self.pending = max(0, self.pending - int(left)) if left and left.isdigit() else 0
            if self.requests:
                self.requests.popleft()
            self.wake.set()
            return
        self.pending = max(0, self.pending - 1)
        if self.stopping:  # shutting down: hand it back at once
            with contextlib.suppress(Exception):
                await msg.nak()
            return
        self.held[id(msg)] = msg
        task = asyncio.create_task(self.run(msg))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def run(self, msg: Msg) -> None:
        try:
            run_id = self.run_of(msg)
            locks = self.bus._run_locks
            if run_id:
                await locks.acquire(run_id)
            try:
                if self.bus._tracer is None:
                    await self.deliver(msg)
                else:
                    ctx = self.bus._extract(msg.headers)
                    with self.bus._span(f"{S.stem(msg.subject)} process", SpanKind.CONSUMER, ctx, msg.headers):
                        await self.deliver(msg)
            finally:
                if run_id:
                    locks.release(run_id)
        except asyncio.CancelledError:  # shutdown ran out of time: hand the message back
            with contextlib.suppress(Exception):
                await msg.nak()
            raise
        except Exception:
            log.exception("%s: delivering %s failed; it will be redelivered", self.bus.service, msg.subject)
        finally:
            self.held.pop(id(msg), None)
            self.wake.set()

    def run_of(self, msg: Msg) -> str | None:
        """The run whose messages this one waits behind (one at a time per run in a replica)."""
        return msg.headers.get(RUN_ID_HEADER) if msg.headers else None

    async def deliver(self, msg: Msg) -> None:
        await self.bus._deliver(msg, self.model, self.handler)

    async def loop(self) -> None:
        nc = self.bus.nc
        while not self.stopping:
            now = time.monotonic()
            while self.requests and self.requests[0] < now - 0.5:  # expired without a status reaching us
                self.requests.popleft()
            if not self.requests:
                self.pending = 0
            free = self.limit - len(self.held) - self.pending
            if free > 0 and (self.pending == 0 or free >= max(1, self.limit // 4)):
                req = {"batch": free, "expires": int(PULL_EXPIRES_S * 1e9)}
                try:
                    await nc.publish(self.next_subject, json.dumps(req).encode(), reply=self.inbox)
                    self.pending += free
                    self.requests.append(now + PULL_EXPIRES_S)
                except Exception as err:  # disconnected: try again shortly
                    log.warning("%s: pull request for %s failed: %r", self.bus.service, self.spec.durable, err)
                    await asyncio.sleep(0.5)
                    continue
            self.wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(PULL_EXPIRES_S / 2):
                    await self.wake.wait()

    async def stop(self, grace: float) -> None:
        """Stop asking for messages, let in-flight ones finish within ``grace``, hand back the rest."""
        self.stopping = True
        self.wake.set()
        if self.loop_task is not None:
            self.loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.loop_task
        if self.tasks:
            _, late = await asyncio.wait(set(self.tasks), timeout=grace)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late, timeout=2)
        if self.sub is not None:
            with contextlib.suppress(Exception):
                await self.sub.unsubscribe()


class _Requeue(_Pull):
    """A requeue durable (``requeue_<service>[_<scope>]``): a dead letter handed back (``Requeue``) is run
    by the service's consumer that takes its subject, as a redelivery of the message (``Bus._requeue``)."""

    def __init__(self, bus: Bus, spec: ConsumerSpec) -> None:
        super().__init__(bus, spec, Requeue, bus._requeue)

    def run_of(self, msg: Msg) -> str | None:
        return None  # the run is the stored letter's, not what the requester's headers say: locked in ``_requeue``

    async def deliver(self, msg: Msg) -> None:
        await self.bus._requeue(msg)


class _Replies:
    """The answers to this connection's JetStream requests (PubAcks, direct gets), collected by one
    wildcard inbox subscription: a request is a plain publish with ``<inbox>.<n>`` as its reply and a
    future resolved by the answer - no inbox token, ``wait_for``, timer or task per request as
    ``nc.request`` makes. Timeouts are kept by one sweeper that runs while answers are awaited: an
    answer not in by its deadline (``LW_JS_TIMEOUT_S`` after sending, noticed within a tick) fails
    with ``NatsTimeoutError``. An answer nobody waits for any more (timed out, or a duplicate) is dropped."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.prefix = ""
        self.waiting: dict[str, tuple[asyncio.Future[Msg], float]] = {}  # token -> (future, deadline)
        self._count = itertools.count(1)
        self._starting: asyncio.Future[None] | None = None
        self._sweeper: asyncio.Task[None] | None = None

    async def _start(self) -> None:
        nc = self.bus.nc
        prefix = nc.new_inbox() + "."  # under this service's inbox prefix (permissions)
        await nc.subscribe(prefix + "*", cb=self._on_reply)
        self.prefix = prefix

    async def ready(self) -> None:
        if self.prefix:
            return
        if self._starting is None:  # the first request subscribes; concurrent ones wait for it
            self._starting = asyncio.get_running_loop().create_future()
            try:
                await self._start()
            except BaseException as err:
                starting, self._starting = self._starting, None
                starting.set_exception(err)
                starting.exception()  # retrieved: the waiters (if any) raise it themselves
                raise
            self._starting.set_result(None)
        else:
            await asyncio.shield(self._starting)

    async def _on_reply(self, msg: Msg) -> None:
        waiting = self.waiting.pop(msg.subject[len(self.prefix) :], None)
        if waiting is not None and not waiting[0].done():
            waiting[0].set_result(msg)

    async def _sweep(self) -> None:
        """Fail what is past its deadline; end when nothing is awaited (``send`` starts it again)."""
        loop = asyncio.get_running_loop()
        tick = min(0.25, self.bus.settings.js_timeout_s / 5)
        try:
            while self.waiting:
                await asyncio.sleep(tick)
                now = loop.time()
                late = [token for token, (fut, deadline) in self.waiting.items() if deadline <= now or fut.done()]
                for token in late:
                    fut, _ = self.waiting.pop(token)
                    if not fut.done():
                        fut.set_exception(NatsTimeoutError())
        finally:
            self._sweeper = None

    async def send(self, subject: str, body: bytes, headers: dict[str, str] | None) -> tuple[str, asyncio.Future[Msg]]:
        """Publish a request; its answer (or ``NatsTimeoutError``) resolves the returned future."""
        if not self.prefix:
            await self.ready()
        loop = asyncio.get_running_loop()
        token = str(next(self._count))
        fut: asyncio.Future[Msg] = loop.create_future()
        self.waiting[token] = (fut, loop.time() + self.bus.settings.js_timeout_s)
        try:
            await publish_raw(self.bus.nc, subject, body, self.prefix + token, headers)
        except BaseException:
            self.waiting.pop(token, None)
            fut.cancel()
            raise
        if self._sweeper is None:
            self._sweeper = loop.create_task(self._sweep(), name="reply timeouts")
        return token, fut

    def close(self) -> None:
        """The connection is closed: nothing will answer; stop the sweeper, fail what still waits."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        waiting, self.waiting = self.waiting, {}
        for fut, _ in waiting.values():
            if not fut.done():
                fut.set_exception(NatsTimeoutError())

    @staticmethod
    async def wait(sent: list[tuple[str, asyncio.Future[Msg]]]) -> None:
        """Wait until every future of ``sent`` has its answer or its timeout."""
        for _, fut in sent:
            if not fut.done():
                try:
                    await fut
                except NatsTimeoutError:
                    pass

    def forget(self, sent: list[tuple[str, asyncio.Future[Msg]]]) -> None:
        """Stop waiting for the answers still open in ``sent`` (their futures are cancelled)."""
        for token, fut in sent:
            if not fut.done():
                self.waiting.pop(token, None)
                fut.cancel()

    async def request(self, subject: str, body: bytes, headers: dict[str, str] | None) -> Msg:
        """One request and its answer; ``NatsTimeoutError`` if none came within ``LW_JS_TIMEOUT_S``."""
        _, fut = await self.send(subject, body, headers)
        return await fut


_HEADER_KEYS_OK: set[str] = set()  # header names already checked against nats-py's rule
# nats-server closes a connection whose control line passes 4 KiB (``max_control_line``) and nats-py does
# not reconnect: a subject this long is refused here, before it reaches the wire (``S.token`` and
# ``S.kv_key`` bound what they build; this catches whatever else a client managed to get into one).
MAX_SUBJECT = 2048
# Where answers go: a user's own inbox prefix (``_INBOX_<user>``, what the grants name) or nats-py's default
INBOX_PREFIXES = ("_INBOX_", "_INBOX.")


class SubjectTooLong(ValueError):
    """A subject (or KV key) longer than ``MAX_SUBJECT``: never sent."""


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
        or nc._status != NatsClient.CONNECTED
        or not subject
        or len(body) > nc._max_payload
        or _SUBJECT_INVALID_RE.search(subject) is not None
    ):
        await nc.publish(subject, body, reply=reply, headers=headers)
        return
    for key in headers:
        if key not in _HEADER_KEYS_OK:
            if not _HEADER_KEY_RE.fullmatch(key):
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
    await nc._send_command(b"".join((f"HPUB {subject} {reply} {len(hdr)} {total}\r\n".encode(), hdr, body, b"\r\n")))
    if nc._flush_queue is not None and nc._flush_queue.empty():
        await nc._flush_pending()


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
            raise
        raise APIError(description=str(error))  # from_error always raises
    return _PubAck(resp.get("stream", ""), int(resp.get("seq", 0)), bool(resp.get("duplicate", False)))


def num_delivered(reply: str | None) -> int:
    """How often a JetStream message was delivered, read from its ack subject as ``Msg.metadata`` reads
    it (``$JS.ACK.<stream>.<consumer>.<delivered>...``, 9 tokens; or 12+ with domain and account
    hash), without building the whole metadata; 1 for anything else."""
    tokens = reply.split(".") if reply else []
    if len(tokens) < 9 or tokens[0] != "$JS" or tokens[1] != "ACK":
        return 1
    try:
        if len(tokens) == 9:
            return int(tokens[4])
        if len(tokens) >= 11:
            return int(tokens[6])
    except ValueError:
        pass
    return 1


def ack_consumer(reply: str | None) -> str | None:
    """The durable consumer a JetStream message was delivered by, read from its ack subject (the same
    two layouts ``num_delivered`` reads); None for anything else (a core NATS request)."""
    tokens = reply.split(".") if reply else []
    if len(tokens) < 9 or tokens[0] != "$JS" or tokens[1] != "ACK":
        return None
    return tokens[3] if len(tokens) == 9 else tokens[5] if len(tokens) >= 11 else None


def _stream_seq(raw: Any) -> int:
    try:
        return int(raw.metadata.sequence.stream)
    except Exception:
        return 0


@dataclass
class Bus:
    settings: Settings
    service: str
    tracer_provider: TracerProvider | None = None
    meter_provider: MeterProvider | None = None
    broker: NatsBroker = field(init=False)
    _consumers: list[ConsumerSpec] = field(default_factory=list)
    _kv: dict[str, KeyValue] = field(default_factory=dict)
    _connected: bool = False
    on_stop: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    payloads: PayloadStore = field(init=False)  # claim check: large bodies by reference

    def __post_init__(self) -> None:
        self.payloads = PayloadStore(self.settings, self.service)  # bodies stored under this user's name
        self._failures = (
            self.meter_provider.get_meter("loopwarden.bus").create_counter(
                "loopwarden.failures", description="failure events by type and tool (every service, one metric)"
            )
            if self.meter_provider
            else None
        )
        self._tracer: Tracer | None = (
            self.tracer_provider.get_tracer("loopwarden.bus") if self.tracer_provider is not None else None
        )
        self._pulls: list[_Pull] = []
        self._requeue_to: dict[str, str] = {}  # durable -> where its dead letters are handed back
        self._stopping = False  # set by ``stop``: a handler waiting for a dependency hands its message back
        self._responders: list[_Responder] = []
        self.dropped_requests = 0  # requests not handled: not from a requester, or no inbox to answer
        # Set when the connection is closed for good while this process did not ask for it (nats-server
        # closes a connection for a protocol error, and nats-py does not reconnect then): ``serve`` exits
        # non-zero so a supervisor restarts the service instead of leaving it up and off the bus.
        self.closed_for_good = asyncio.Event()
        self._subs: list[Subscription] = []
        self._background: set[asyncio.Task[Any]] = set()
        self._run_locks = _RunLocks()
        self._scenarios: OrderedDict[str, Scenario | None] = OrderedDict()
        self._started = False
        self._js: JetStreamContext | None = None
        self._rpc_slots = asyncio.Semaphore(self.settings.in_flight_for(self.service))
        self._replies = _Replies(self)
        s = self.settings
        security = None
        if s.nats_user:
            password = s.nats_password.get_secret_value() if s.nats_password else ""
            security = NatsUserPassword(username=s.nats_user, password=password)
        self.broker = NatsBroker(
            [u.strip() for u in s.nats_url.split(",")],
            name=f"loopwarden-{self.service}",
            security=security,
            inbox_prefix=self.inbox_prefix,  # one inbox namespace per service: replies stay private
            log_level=logging.DEBUG,
            max_reconnect_attempts=-1,
            graceful_timeout=max(10.0, s.ack_wait_s),
            disconnected_cb=self._on_disconnected,
            reconnected_cb=self._on_reconnected,
            closed_cb=self._on_closed,
        )

    async def _on_disconnected(self) -> None:
        closed = False
        with contextlib.suppress(Exception):
            closed = self.broker.connection.is_closed  # our own close(), not a lost server
        if not closed:
            log.warning("%s: disconnected from NATS; reconnecting", self.service)

    async def _on_closed(self) -> None:
        err = None
        with contextlib.suppress(Exception):
            err = self.broker.connection.last_error
        # Closed by us (``stop``, ``broker.stop``): no error. A permissions violation is an error nats-py
        # remembers without closing, so it does not count either.
        if self._stopping or err is None or "permissions violation" in str(err).lower():
            return
        log.error("%s: the NATS connection is closed for good (%r)", self.service, err)
        self.closed_for_good.set()

    async def _on_reconnected(self) -> None:
        from shared.urls import redact_url  # a password in LW_NATS_URL is never logged

        url = ""
        with contextlib.suppress(Exception):
            url = redact_url(str(getattr(self.broker.connection.connected_url, "netloc", "")))
        log.warning("%s: reconnected to NATS %s", self.service, url)

    # --- lifecycle ---------------------------------------------------------------------------
    @property
    def inbox_prefix(self) -> str:
        return S.inbox_prefix(self.service)

    @property
    def nc(self) -> NatsClient:
        return self.broker.connection

    @property
    def js(self) -> JetStreamContext:
        if self._js is None:
            self._js = self.broker.connection.jetstream()
        return self._js

    async def connect(self) -> None:
        """Connect, then make sure the streams, buckets and consumers this process uses exist.

        Unmanaged (``LW_MANAGE_STREAMS=true``, the local default): what is missing is created,
        nothing that exists is changed (a client never drops a 3-replica stream to 1).
        Managed (``false``): ``loopwarden bootstrap`` created everything; this process creates
        and changes nothing and waits until all of it exists (a fresh cluster, bootstrap not
        run yet) instead of exiting."""
        await self.broker.connect()
        if self.settings.manage_streams:
            await self.until_ready("streams", lambda: ensure_streams(self.js, self.settings))
        else:
            for stream in streams_seen(self.service):  # a tenant-bound client: the one it submits to
                await self.until_ready(f"stream {stream}", functools.partial(self.js.stream_info, stream))
            for bucket in needed_buckets(self.service):
                self._kv[bucket] = await self.until_ready(
                    f"bucket {bucket}", functools.partial(self.js.key_value, bucket)
                )
        for spec in self._consumers:
            await self._reconcile_consumer(spec)
        self._connected = True

    async def through_failover(
        self,
        what: str,
        call: Callable[[], Awaitable[R]],
        *,
        repeatable: bool = False,
        resolve: Callable[[], Awaitable[R | None]] | None = None,
    ) -> R:
        """Run a JetStream request, riding out a stream electing a new leader (a node died).

        "No responders" and "JetStream system temporarily unavailable" (503, the meta leader is
        being elected) mean nothing was stored: it is sent again. A timeout is ambiguous: it
        is sent again when repeating is harmless (``repeatable``: a read, a plain put, a publish
        de-duplicated by its id); a compare-and-swap is sent again unless ``resolve`` finds it
        was applied (a repeat of an applied one fails as a conflict, as with any other writer).
        So a handler keeps what it knows in memory (a tool that already ran) instead of failing
        and leaving a redelivery to guess. Gives up after ``LW_FAILOVER_RETRY_S``."""
        deadline = time.monotonic() + self.settings.failover_retry_s
        delay = 0.1
        while True:
            try:
                return await call()
            except (NoStreamResponseError, NoRespondersError, ServiceUnavailableError) as err:
                failure: Exception = err  # nothing was stored
            except (NatsTimeoutError, TimeoutError) as err:
                failure = err
                if resolve is not None:  # a compare-and-swap: ours if the stored value is ours
                    with contextlib.suppress(NatsTimeoutError, TimeoutError, NoStreamResponseError, NoRespondersError):
                        applied = await resolve()
                        if applied is not None:
                            return applied
                elif not repeatable:
                    raise
            if time.monotonic() > deadline:
                raise failure
            log.warning("%s: %s: JetStream unavailable (%s), again", self.service, what, describe_nats_error(failure))
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def until_ready(self, what: str, attempt: Callable[[], Awaitable[R]]) -> R:
        """Retry ``attempt`` while JetStream is not ready or what it needs does not exist yet
        (logged every few seconds, naming what is missing); other errors are raised."""
        return await until_ready(self.service, what, attempt, self.settings.infra_wait_s)

    @property
    def consumer_specs(self) -> list[ConsumerSpec]:
        """The durable consumers this process declared (what bootstrap creates for it)."""
        return list(self._consumers)

    async def reconcile_consumers(self) -> None:
        for spec in self._consumers:
            await self._reconcile_consumer(spec)

    def _spawn(self, coro: Coroutine[Any, Any, Any], name: str | None = None) -> None:
        task = asyncio.create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def start(self) -> None:
        """Start consuming: every registered durable and request/reply subject."""
        if not self._connected:
            await self.connect()
        for r in self._responders:

            async def on_request(msg: Msg, r: _Responder = r) -> None:
                self._spawn(self._answer(r, msg), name=f"answer {msg.subject}")

            self._subs.append(await self.nc.subscribe(r.subject, queue=self.service, cb=on_request))
        for pull in self._pulls:
            await pull.start()
        self._spawn(self._heartbeats())
        self._started = True

    async def stop(self) -> None:
        """Finish in-flight handlers (handing back what does not finish in time), close the
        connection (or just close if the server is already gone), then run the ``on_stop``
        hooks (e.g. closing MCP sessions), each bounded."""
        self._stopping = True
        try:
            connected = self.broker.connection.is_connected
        except Exception:  # never connected
            connected = False
        try:
            for sub in self._subs:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
            grace = max(1.0, min(self.settings.ack_wait_s, 10.0)) if connected else 0.5
            await asyncio.gather(*(pull.stop(grace) for pull in self._pulls), return_exceptions=True)
            answering = [t for t in self._background if t.get_name().startswith("answer")]
            if answering:  # requests being served get the same grace
                await asyncio.wait(answering, timeout=grace)
            for task in list(self._background):
                task.cancel()
            if connected:
                await self.broker.stop()
            else:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(2):
                        await self.broker.stop()
            self._replies.close()
        finally:
            for hook in self.on_stop:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(5):
                        await hook()

    async def _reconcile_consumer(self, spec: ConsumerSpec) -> None:
        if not self.settings.manage_streams:
            # Managed: bootstrap created it (the service's user may not change it); wait for it.
            info = await self.until_ready(
                f"consumer {spec.stream}/{spec.durable}", lambda: self.js.consumer_info(spec.stream, spec.durable)
            )
            drift = consumer_drift(info.config, consumer_config(spec, self.settings))
            if drift:
                log.warning(
                    "%s: consumer %s differs from this service's settings (%s); run `loopwarden bootstrap`",
                    self.service,
                    spec.durable,
                    drift,
                )
            return
        # JetStream's create request without an action is create-or-update, so a changed
        # ack_wait / max_deliver in settings takes effect.
        cfg = consumer_config(spec, self.settings)
        await self.until_ready(f"consumer {spec.stream}/{spec.durable}", lambda: self.js.add_consumer(spec.stream, cfg))

    # --- consuming ---------------------------------------------------------------------------
    def consumer(
        self,
        *,
        durable: str,
        filter_subjects: list[str],
        model: type[M],
        stream: str | None = None,
        requeue_scope: str | None = None,
    ) -> Callable[[Handler[M]], Handler[M]]:
        """Register ``handler(payload)`` on a durable JetStream pull consumer.
        Its dead letters are handed back on ``S.requeue(service, requeue_scope)``: a scope for consumers
        that not every replica of the service has (the executor's per hosted tool).

        The bus drives the pull subscription itself (no framework per message): up to
        ``LW_MAX_IN_FLIGHT`` messages of this replica run at once, messages of one run are
        handled one after another (a lock per ``Lw-Run-Id``), every in-flight message is
        heartbeaten. ``stream``: the one whose subjects hold the filter (``S.stream_for``) unless named."""
        stream = stream or S.stream_for(filter_subjects[0]) or S.STREAM_CMD
        spec = ConsumerSpec(stream, durable, tuple(filter_subjects), self.service)
        self._consumers.append(spec)

        def register(handler: Handler[M]) -> Handler[M]:
            pulls: list[_Pull] = [_Pull(self, spec, model, handler)]
            # A service that consumes anything can be handed its dead letters back: its requeue durable is
            # declared with its first consumer of that scope (bootstrap and the start-up checks see it).
            to = S.requeue(self.service, requeue_scope)
            self._requeue_to[durable] = to
            if not any(isinstance(p, _Requeue) and p.spec.filter_subjects == (to,) for p in self._pulls):
                requeue = ConsumerSpec(
                    S.stream_for(to) or S.STREAM_SUBMIT,
                    S.requeue_durable(self.service, requeue_scope),
                    (to,),
                    self.service,
                )
                self._requeue_to[requeue.durable] = to  # a requeue that fails again is handed back the same way
                self._consumers.append(requeue)
                pulls.append(_Requeue(self, requeue))
            self._pulls += pulls
            if self._started:  # registered after start (e.g. tools mounted late): consume now
                for pull in pulls:
                    self._spawn(pull.start())
            return handler

        return register

    def responder(
        self,
        *,
        subject: str,
        model: type[M],
        reply: Callable[[str], BaseModel],
    ) -> Callable[[Callable[[M], Awaitable[BaseModel]]], Callable[[M], Awaitable[BaseModel]]]:
        """Register a queue-grouped request/reply handler. Every request gets an answer: a
        malformed one (or one whose handler fails) is dead-lettered with its reason and answered
        with ``reply(reason)`` instead of hanging the caller."""

        def register(handler: Callable[[M], Awaitable[BaseModel]]) -> Callable[[M], Awaitable[BaseModel]]:
            self._responders.append(_Responder(subject, model, handler, reply))
            return handler

        return register

    def subject_responder(
        self,
        *,
        subject: str,
        model: type[M],
        reply: Callable[[str], BaseModel],
    ) -> Callable[[Callable[[M, str], Awaitable[BaseModel]]], Callable[[M, str], Awaitable[BaseModel]]]:
        """``responder`` for handlers that need the subject the request arrived on (e.g. an identity
        token the server's permissions guarantee); ``subject`` may be a wildcard."""

        def register(handler: Callable[[M, str], Awaitable[BaseModel]]) -> Callable[[M, str], Awaitable[BaseModel]]:
            self._responders.append(_Responder(subject, model, handler, reply, with_subject=True))
            return handler

        return register

    def _unanswerable(self, r: _Responder, msg: Msg) -> str | None:
        """Why a request must not be handled at all (None: handle it). A responder takes only what a
        requester published on its own subject: not a stream's push delivery (it keeps the subject it was
        stored on, and its reply is an ack subject), and answers only to an inbox - a reply naming a KV key
        or a command subject would make this service write there."""
        if msg.reply and msg.reply.startswith("$JS.ACK."):
            return "delivered by a JetStream consumer, not sent by a requester"
        if not S.matches(r.subject, msg.subject):
            return f"arrived on {msg.subject[:200]}, not on {r.subject}"
        if msg.reply and not msg.reply.startswith(INBOX_PREFIXES):
            return f"its reply {msg.reply[:200]} is not an inbox"
        return None

    async def _answer(self, r: _Responder, msg: Msg) -> None:
        why = self._unanswerable(r, msg)
        if why is not None:  # dropped, not dead-lettered: a flood of these must not flood LW_DLQ too
            self.dropped_requests += 1
            if self.dropped_requests in (1, 10, 100) or self.dropped_requests % 1000 == 0:
                log.warning("%s: request dropped (%d so far): %s", self.service, self.dropped_requests, why)
            return
        async with self._rpc_slots:
            ctx = self._extract(msg.headers) if self._tracer is not None else None
            with self._span(f"{msg.subject} process", SpanKind.SERVER, ctx, msg.headers):
                try:
                    payload = await self._decode(r.model, msg)
                except Undecodable as err:
                    reason = str(err)
                    out: BaseModel = r.reply(reason)
                    with contextlib.suppress(Exception):
                        await self.dead_letter(msg, reason, 1)
                else:
                    try:
                        out = await (r.handler(payload, msg.subject) if r.with_subject else r.handler(payload))
                    except Exception as err:
                        log.exception("%s: request on %s failed", self.service, msg.subject)
                        reason = f"handler failed: {err!r}"
                        out = r.reply(reason)
                        with contextlib.suppress(Exception):
                            await self.dead_letter(msg, reason, 1)
                if msg.reply:
                    with contextlib.suppress(Exception):
                        await self.nc.publish(msg.reply, out.model_dump_json(by_alias=True).encode())

    async def _decode(self, model: type[M], msg: Msg) -> M:
        """The body as ``model``, fetched from the payload store first when it travelled by
        reference; ``Undecodable`` names why it cannot be had."""
        try:
            data = await self.payloads.inflate(
                self.nc, msg.data, msg.headers, max_bytes=self.settings.body_limit(model.__name__)
            )
        except PayloadTooLarge as err:  # refused before it is fetched: the service never holds it
            raise Undecodable(f"does not match contract {model.__name__}: {err}") from None
        except PayloadError as err:
            raise Undecodable(f"payload reference cannot be resolved: {err}") from None
        return decode(model, data)

    async def _deliver(
        self, msg: Msg, model: type[M], handler: Handler[M], *, earlier: int = 0, requeued_from: int | None = None
    ) -> None:
        """Decode, run the handler, then ack; dead-letter what cannot be delivered, with its reason.
        A requeued letter (``requeued_from``) comes through here too: ``earlier`` deliveries happened
        before it was dead-lettered, so its handler sees a redelivery, and the limits count this life's."""
        deliveries = num_delivered(msg.reply)
        limit = self.settings.max_deliver

        async def give_up(reason: str) -> None:
            await self.dead_letter(msg, reason, earlier + deliveries, requeued_from=requeued_from)
            await msg.ack()

        if deliveries > limit:
            # It never completed: the handler crashed its process (or hung) on every delivery.
            # Dead-letter it *before* running the handler again.
            await give_up(f"not completed after {deliveries - 1} deliveries (the handler crashed or hung)")
            return
        try:
            payload = await self._decode(model, msg)
        except Undecodable as err:
            await give_up(str(err))
            return
        token = _DELIVERIES.set(earlier + deliveries)
        subject_token = _SUBJECT.set(msg.subject)
        waited: TryLater | None = None
        started = time.monotonic()
        try:
            # A dependency that is not ready (``TryLater``: the governor restarting) is retried here, the
            # message held under its heartbeat, for up to the ack wait counted from this delivery, so an
            # outage spends no delivery (deliveries count crashes: ``max_deliver`` of them dead-letter the
            # message); past that, or when the service stops, the message is handed back for later.
            while True:
                try:
                    await handler(payload)
                    break
                except TryLater as later:
                    held = time.monotonic() - started
                    if not later.in_place or self._stopping or held + later.delay > self.settings.ack_wait_s:
                        waited = later
                        break
                    log.info("%s: retry later (%s)", self.service, later)
                    await asyncio.sleep(max(later.delay, MIN_RETRY_S))
                    if self._stopping:
                        waited = later
                        break
                    _DELIVERIES.set(earlier + deliveries + 1)  # taken again: a handler reuses what the last take stored
        except Exception as err:
            if deliveries >= limit:
                log.exception("%s: giving up on %s after %d deliveries", self.service, msg.subject, deliveries)
                await give_up(f"handler failed {deliveries} times: {err!r}")
                return
            log.warning("%s: handler failed on %s (delivery %d): %r", self.service, msg.subject, deliveries, err)
            await msg.nak(delay=self.settings.redeliver_delay_s * 2 ** (deliveries - 1))
            return
        finally:
            _DELIVERIES.reset(token)
            _SUBJECT.reset(subject_token)
        if waited is None:
            await msg.ack()
        elif deliveries >= limit:  # not ready through every delivery: say so, not "crashed"
            log.error("%s: giving up on %s: %s", self.service, msg.subject, waited)
            held = time.monotonic() - started
            await give_up(f"still not ready after {deliveries} deliveries ({held:.0f}s on the last): {waited}")
        else:
            log.info("%s: retry later, handed back (%s)", self.service, waited)
            await msg.nak(delay=waited.delay)

    async def _requeue(self, msg: Msg) -> None:
        """A dead letter handed back (``Requeue`` on ``requeue_<service>``): run it through this service's
        consumer that takes its subject, as a redelivery, and ack or hand back ``msg`` as that consumer
        would have. It fails as any delivery does: tried again in place while a dependency is not ready,
        then dead-lettered again with its reason, naming the letter it was requeued from."""
        deliveries = num_delivered(msg.reply)
        limit = self.settings.max_deliver

        async def refuse(why: str) -> None:
            await self.dead_letter(msg, f"not requeued: {why}", deliveries)
            await msg.ack()

        if deliveries > limit:  # it crashed this process (or hung) on every delivery
            await refuse(f"not completed after {deliveries - 1} deliveries (the handler crashed or hung)")
            return
        try:
            cmd = await self._decode(Requeue, msg)
            # The letter as this service stored it, not anything the requester sent: a requeue hands back
            # what this service gave up on and can make it run nothing else.
            stored_on, letter = await self.read_letter(cmd.letter)
            why = not_ours(cmd.letter, stored_on, letter, self.service)
            if why is None:  # once per letter, whatever message ids the requesters used
                why = await self._take_back_once(cmd.letter, _stream_seq(msg))
        except (Undecodable, NoSuchLetter, NotRequeueable) as err:
            why = str(err)
        except BadRequestError as err:  # e.g. a number JetStream cannot read (>= 2^64): no such letter
            why = f"letter {str(cmd.letter)[:40]} cannot be read: {describe_nats_error(err)}"
        except (
            NatsTimeoutError,
            TimeoutError,
            NoRespondersError,
            NoStreamResponseError,
            ServiceUnavailableError,
        ) as err:
            if deliveries >= limit:  # the letter could not be read through every delivery
                await refuse(f"the letter could not be read after {deliveries} deliveries: {err!r}")
            else:  # JetStream not answering (a leader election, a restart): the requeue waits, it is not lost
                log.warning("%s: requeue handed back, the letter could not be read: %r", self.service, err)
                await msg.nak(delay=self.settings.redeliver_delay_s * 2 ** (deliveries - 1))
            return
        if why is not None:
            await refuse(why)
            return
        run_id = letter.headers.get(RUN_ID_HEADER)
        if run_id:  # behind the run's other messages in this replica, as its consumer would have it
            await self._run_locks.acquire(run_id)
        try:
            await self._requeued(msg, cmd.letter, letter, deliveries)
        finally:
            if run_id:
                self._run_locks.release(run_id)

    async def _take_back_once(self, letter: int, requeue_seq: int) -> str | None:
        """Claim letter ``letter`` for the requeue command stored at ``requeue_seq`` (``lw_requeues``,
        ``<service>.<letter>``, created with compare-and-swap): None if it is this command's (the first,
        or this command delivered again), else why not - it was handed back already."""
        claim = RequeueClaim(letter=letter, requeue_seq=requeue_seq)
        stored, _, created = await self.create_or_get(S.KV_REQUEUES, S.kv_key(self.service, str(letter)), claim)
        if created or stored.requeue_seq == requeue_seq:
            return None
        return f"letter {letter} was handed back already (requeue #{stored.requeue_seq}); a letter is requeued once"

    async def _requeued(self, msg: Msg, seq: int, letter: DeadLetter, deliveries: int) -> None:
        """Run letter ``seq`` (read and checked by ``_requeue``) through the consumer that takes it."""
        headers = carried_headers(letter.headers)
        # The message as it first arrived (subject, body, headers), acknowledged through the requeue's own
        # ack subject: in-progress, ack, nak and the delivery count are this requeue's.
        original = dataclasses.replace(msg, subject=letter.subject, data=letter.body.encode(), headers=headers)
        takers = [p for p in self._pulls if type(p) is _Pull]  # not the requeue durable itself
        durable = taker(((p.spec.durable, p.spec.filter_subjects) for p in takers), letter.subject)
        pull = next((p for p in takers if p.spec.durable == durable), None)
        if pull is None:  # another replica may consume it (an executor hosting other tools)
            reason = f"no consumer of {self.service} here takes {letter.subject}"
            if deliveries >= self.settings.max_deliver:
                await self.dead_letter(original, reason, letter.deliveries + deliveries, requeued_from=seq)
                await msg.ack()
            else:
                log.warning("%s: letter %d handed back: %s", self.service, seq, reason)
                await msg.nak(delay=self.settings.redeliver_delay_s)
            return
        log.info("%s: letter %d requeued on %s (%s)", self.service, seq, pull.spec.durable, letter.subject)
        earlier = letter.deliveries
        deliver = self._deliver(original, pull.model, pull.handler, earlier=earlier, requeued_from=seq)
        if self._tracer is None or "traceparent" not in headers:
            await deliver
            return
        # Processed in the trace the message belonged to (the run's), whoever requeued it and whether or
        # not they traced: what the handler does now continues the run's trace.
        with self._span(f"{S.stem(letter.subject)} process", SpanKind.CONSUMER, self._extract(headers), headers):
            await deliver

    async def read_letter(self, seq: int) -> tuple[str, DeadLetter]:
        """Dead letter number ``seq`` and the subject it is stored on (``NoSuchLetter``; ``NotRequeueable``
        when what is stored there does not read as a letter)."""
        js = self.js
        try:
            raw = await self.through_failover(
                f"read letter {seq}", lambda: js.get_msg(S.STREAM_DLQ, seq), repeatable=True
            )
        except NotFoundError:
            raise NoSuchLetter(f"no dead letter numbered {seq} in {S.STREAM_DLQ}") from None
        try:
            data = await self.payloads.inflate(self.nc, raw.data or b"", raw.headers)
        except PayloadError as err:
            raise NotRequeueable(f"letter {seq} travelled by reference and cannot be read: {err}") from None
        try:
            return raw.subject or "", DeadLetter.model_validate_json(data)
        except ValidationError as err:
            raise NotRequeueable(f"letter {seq} does not read as a DeadLetter: {describe(err)}") from None

    async def _heartbeats(self) -> None:
        interval = max(0.2, self.settings.ack_wait_s / 3)
        while True:
            await asyncio.sleep(interval)
            held = [m for pull in self._pulls for m in pull.held.values()]
            for m in held:
                with contextlib.suppress(Exception):
                    await m.in_progress()

    async def dead_letter(self, raw: Any, reason: str, deliveries: int, *, requeued_from: int | None = None) -> None:
        consumer = ack_consumer(getattr(raw, "reply", None))
        letter = DeadLetter(
            service=self.service,
            subject=raw.subject,
            reason=reason,
            body=letter_body(raw.data),
            headers={k: str(v) for k, v in (raw.headers or {}).items()},
            deliveries=deliveries,
            requeued_from=requeued_from,
            requeue_to=self._requeue_to.get(consumer) if consumer else None,
        )
        seq = _stream_seq(raw)  # a core NATS request has no JetStream metadata
        if requeued_from is not None:  # ``seq`` is the requeue command's (LW_CMD), not the message's own
            msg_id = f"dlq-{self.service}-requeue-{requeued_from}-{seq}"
        elif seq:
            msg_id = f"dlq-{self.service}-{raw.subject}-{seq}"
        else:
            msg_id = f"dlq-{self.service}-{uuid.uuid4().hex}"
        await self.publish(S.dead_letter(self.service), letter, msg_id=msg_id)
        log.error("%s: dead-lettered %s: %s", self.service, raw.subject, reason)

    # --- tracing (only when spans are exported) ------------------------------------------------
    def _extract(self, headers: dict[str, str] | None) -> otel_context.Context | None:
        return propagate.extract(headers or {})

    @contextlib.contextmanager
    def _span(
        self, name: str, kind: SpanKind, ctx: otel_context.Context | None, headers: dict[str, str] | None
    ) -> Iterator[None]:
        if self._tracer is None:
            yield
            return
        attrs: dict[str, str] = {"messaging.system": "nats", "messaging.destination.name": name.rsplit(" ", 1)[0]}
        run_id = (headers or {}).get(RUN_ID_HEADER)
        if run_id:
            attrs[LW_RUN_ID_ATTR] = run_id
        with self._tracer.start_as_current_span(name, context=ctx, kind=kind, attributes=attrs):
            yield

    # --- publishing --------------------------------------------------------------------------
    async def publish(
        self,
        subject: str,
        payload: BaseModel | bytes,
        *,
        msg_id: str | None = None,
        run_id: str | None = None,
        traceparent: str | None = None,
    ) -> _PubAck:
        """Publish to JetStream and await its PubAck (returned: ``duplicate`` says the server had the
        message id already); ``msg_id`` makes a re-publish after a crash a no-op. An event that belongs
        to a run goes out with the run id as its last subject token (``S.run_scoped``): ``subject`` is the stem."""
        stem, subject, body, headers = await self._outgoing(subject, payload, msg_id, run_id)
        if self._tracer is not None:
            token = None
            if traceparent:  # continue a stored trace (e.g. a human resolving an escalation)
                token = otel_context.attach(propagate.extract({"traceparent": traceparent}))
            try:
                with self._span(f"{stem} publish", SpanKind.PRODUCER, None, headers):
                    propagate.inject(headers)
                    ack = await self._js_publish(subject, body, headers, repeatable=msg_id is not None)
            finally:
                if token is not None:
                    otel_context.detach(token)
        else:
            ack = await self._js_publish(subject, body, headers, repeatable=msg_id is not None)
        self._count_failure(stem, ack)
        return ack

    async def _outgoing(
        self, subject: str, payload: BaseModel | bytes, msg_id: str | None, run_id: str | None
    ) -> tuple[str, str, bytes, dict[str, str]]:
        """(stem, subject, body, headers) of a message to publish: the run-scoped subject, the body
        (by reference when large), the message id and run id headers."""
        headers = {"content-type": "application/json"}
        if msg_id:
            headers[MSG_ID_HEADER] = msg_id
        run_id = run_id or getattr(payload, "run_id", None)
        if run_id:
            headers[RUN_ID_HEADER] = run_id
        stem, subject = subject, S.run_scoped(subject, run_id)
        body = payload if isinstance(payload, bytes) else payload.model_dump_json(by_alias=True).encode()
        body = await self.payloads.offload(self.nc, body, headers)
        return stem, subject, body, headers

    def _count_failure(self, stem: str, ack: _PubAck) -> None:
        if self._failures is not None and stem.startswith(S.FAILURE_PREFIX + ".") and not ack.duplicate:
            _, ftype, tool = stem.rsplit(".", 2)
            self._failures.add(1, {"failure.type": ftype, "tool": tool})

    async def publish_all(self, items: list[tuple[str, bytes, str | None]], run_id: str | None = None) -> None:
        """Publish several messages in order and await their PubAcks together (one wait, not one each):
        all are sent, then one timeout covers every PubAck; what failed over (a timeout of a message
        with an id, no stream leader) is sent again with the same message id."""
        if len(items) == 1 or self._tracer is not None:  # traced: one span per publish
            await asyncio.gather(
                *(self.publish(subject, body, msg_id=msg_id, run_id=run_id) for subject, body, msg_id in items)
            )
            return
        out = [await self._outgoing(subject, body, msg_id, run_id) for subject, body, msg_id in items]
        acks = await self._js_publish_many(
            [
                (subject, body, headers, msg_id is not None)
                for (_, subject, body, headers), (_, _, msg_id) in zip(out, items, strict=True)
            ]
        )
        for (stem, _, _, _), ack in zip(out, acks, strict=True):
            self._count_failure(stem, ack)

    async def _js_publish(self, subject: str, body: bytes, headers: dict[str, str], *, repeatable: bool) -> _PubAck:
        # A repeat is harmless when the message id de-duplicates it; JetStream rides out a leader election.
        expect_stream(subject, headers)
        return await self.through_failover(
            f"publish {subject}", lambda: self._js_request(subject, body, headers), repeatable=repeatable
        )

    async def _js_request(self, subject: str, body: bytes, headers: dict[str, str] | None) -> _PubAck:
        """One JetStream publish and its PubAck (errors raised as ``pub_ack`` raises them)."""
        return pub_ack(await self._replies.request(subject, body, headers))

    async def _js_publish_many(self, items: list[tuple[str, bytes, dict[str, str], bool]]) -> list[_PubAck]:
        """``through_failover`` for a batch of (subject, body, headers, repeatable): every message is
        sent in order, the PubAcks are awaited under one timeout; a message that timed out (if
        repeatable) or found no stream leader is sent again (same headers, so the same message id)
        until ``LW_FAILOVER_RETRY_S``; any other error is raised."""
        for subject, _, headers, _ in items:
            expect_stream(subject, headers)
        deadline = time.monotonic() + self.settings.failover_retry_s
        delay = 0.1
        acks: list[_PubAck | None] = [None] * len(items)
        todo = list(range(len(items)))
        while True:
            sent: list[tuple[str, asyncio.Future[Msg]]] = []
            try:
                for i in todo:
                    subject, body, headers, _ = items[i]
                    sent.append(await self._replies.send(subject, body, headers))
            except BaseException:
                self._replies.forget(sent)  # nobody awaits what went out
                raise
            await self._replies.wait(sent)
            again: list[int] = []
            failure: Exception | None = None
            for i, (_, fut) in zip(todo, sent, strict=True):
                if fut.exception() is not None:  # no PubAck in time (the only exception set): ambiguous
                    failure = NatsTimeoutError()
                    if not items[i][3]:
                        raise failure
                    again.append(i)
                    continue
                try:
                    acks[i] = pub_ack(fut.result())
                except (NoStreamResponseError, ServiceUnavailableError) as err:  # nothing was stored
                    failure = err
                    again.append(i)
            if failure is None:
                return [ack for ack in acks if ack is not None]
            if time.monotonic() > deadline:
                raise failure
            log.warning(
                "%s: publish %s: JetStream unavailable (%s), again",
                self.service,
                items[again[0]][0],
                describe_nats_error(failure),
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
            todo = again

    async def request(self, subject: str, payload: BaseModel, reply: type[M]) -> M:
        """Core-NATS request/reply (queue-grouped service), decoded into ``reply``; an
        ``ErrorReply`` from the service raises ``RequestRefused`` with its reason."""
        check_subject(subject)
        headers = {"content-type": "application/json"}
        data = await self.payloads.offload(self.nc, payload.model_dump_json(by_alias=True).encode(), headers)
        if self._tracer is not None:
            with self._span(f"{subject} publish", SpanKind.CLIENT, None, headers):
                propagate.inject(headers)
                resp = await self.nc.request(subject, data, timeout=self.settings.rpc_timeout_s, headers=headers)
        else:
            resp = await self.nc.request(subject, data, timeout=self.settings.rpc_timeout_s, headers=headers)
        body = await self.payloads.inflate(self.nc, resp.data, resp.headers)
        try:
            return reply.model_validate_json(body)
        except ValidationError:
            try:
                refused = ErrorReply.model_validate_json(body)
            except ValidationError:
                raise
            raise RequestRefused(refused.error) from None

    # --- key-value ---------------------------------------------------------------------------
    async def kv(self, bucket: str) -> KeyValue:
        if bucket not in self._kv:
            try:
                self._kv[bucket] = await self.js.key_value(bucket)
            except BucketNotFoundError:
                if not self.settings.manage_streams:
                    raise
                # Unmanaged: created on first use (never changed if it exists).
                await self.until_ready(f"bucket {bucket}", lambda: ensure_buckets(self.js, self.settings, [bucket]))
                self._kv[bucket] = await self.js.key_value(bucket)
        return self._kv[bucket]

    async def kv_get(self, bucket: str, key: str, model: type[M]) -> tuple[M | None, int]:
        """The stored model and its revision (0 when absent)."""
        kv = await self.kv(bucket)
        try:
            value, revision = await self.through_failover(
                f"read {bucket}/{key}", lambda: self._kv_read(kv, key), repeatable=True
            )
        except KeyNotFoundError:
            return None, 0
        if value is None:
            return None, revision
        value = await self.payloads.inflate_value(self.broker.connection, value)
        return model.model_validate_json(value), revision

    async def _kv_read(self, kv: KeyValue, key: str) -> tuple[bytes | None, int]:
        """(value, revision) of ``key`` as ``KeyValue.get`` reads it - a deleted or purged key is
        ``KeyNotFoundError`` - by a direct get answered through the bus's reply collector."""
        pre: str = kv._pre
        if not kv._direct:  # a bucket made without direct gets: nats-py's stream API request
            entry = await kv.get(key)
            return entry.value, entry.revision or 0
        if not _is_key_valid(key):
            raise InvalidKeyError(key)
        subject = pre + key
        if len(subject) > MAX_SUBJECT:  # no writer makes a key this long (``kv_put``): it is not there
            raise KeyNotFoundError
        msg = await self._replies.request(f"{self.js._prefix}.DIRECT.GET.{kv._stream}.{subject}", b"", None)
        headers = msg.headers or {}
        if not msg.data:
            status = headers.get("Status")
            if status == "404":
                raise KeyNotFoundError
            if status == "503":
                raise NoRespondersError
            if status:
                APIError.from_msg(msg)
        if headers.get("Nats-Subject") != subject:
            raise KeyNotFoundError(message=f"expected '{subject}', but got '{headers.get('Nats-Subject')}'")
        if headers.get(KV_OP_HEADER) in ("DEL", "PURGE"):
            raise KeyNotFoundError
        return (msg.data or None), int(headers.get("Nats-Sequence") or 0)

    async def update(
        self,
        bucket: str,
        key: str,
        model: type[M],
        change: Callable[[M | None], tuple[M, R] | Unchanged[R]],
        attempts: int = 20,
        *,
        known: tuple[M, int] | None = None,
        saved: Callable[[M | None, int], None] | None = None,
    ) -> R:
        """Read-modify-write under compare-and-swap: ``change`` gets the current value (None if
        absent) and returns the new value with a result, or ``Unchanged(result)``. A conflict
        (another writer got there first) re-reads and calls ``change`` again, after a jittered backoff
        from the second conflict on.

        ``known`` is a (value, revision) the caller already holds (e.g. what it wrote last): it is
        tried first without reading; ``change`` may mutate it. ``saved(value, revision)`` is told
        what is stored once the update is done, so the caller can keep it for next time."""
        current: M | None
        for attempt in range(attempts):
            if attempt > 1:  # writers racing for one key (a tenant's day): back off, jittered, so one wins
                await asyncio.sleep(random.uniform(0, min(0.01 * 2**attempt, 0.5)))
            guessed = known is not None
            if known is not None:
                current, revision = known
                known = None
            else:
                current, revision = await self.kv_get(bucket, key, model)
            outcome = change(current)
            if isinstance(outcome, Unchanged):
                if guessed:  # "nothing to do" is only trusted on what is really stored
                    continue
                if saved is not None:
                    saved(current, revision)
                return outcome.result
            new, result = outcome
            try:
                revision = await self.kv_put(bucket, key, new, revision=revision)
            except CasConflict:
                continue
            if saved is not None:
                saved(new, revision)
            return result
        raise CasConflict(f"{bucket}/{key}: still contended after {attempts} attempts")

    async def kv_put(self, bucket: str, key: str, value: BaseModel, *, revision: int | None = None) -> int:
        """Write ``value``; with ``revision`` it is a compare-and-swap (0 = must not exist yet)."""
        kv = await self.kv(bucket)
        data = value.model_dump_json(by_alias=True).encode()
        data = await self.payloads.offload_value(self.broker.connection, data)
        if not _is_key_valid(key) or len(kv._pre) + len(key) > MAX_SUBJECT:
            raise InvalidKeyError(key[:200])
        subject: str = kv._pre + key
        try:
            if revision is None:
                ack = await self.through_failover(
                    f"write {bucket}/{key}", lambda: self._js_request(subject, data, None), repeatable=True
                )
                return ack.seq

            async def landed() -> int | None:  # a timed-out compare-and-swap may have been applied
                with contextlib.suppress(KeyNotFoundError):
                    entry = await kv.get(key)
                    if entry.value == data and (entry.revision or 0) > revision:
                        return entry.revision
                return None

            expect = {EXPECTED_LAST_SUBJECT_SEQUENCE_HEADER: str(revision)}

            async def cas() -> int:
                return (await self._js_request(subject, data, expect)).seq

            try:
                return await self.through_failover(f"write {bucket}/{key}", cas, resolve=landed)
            except KeyWrongLastSequenceError:
                if revision != 0:
                    raise
            # The key exists - or only its delete marker does: nats-py's create() recreates a deleted key.
            return await self.through_failover(f"write {bucket}/{key}", lambda: kv.create(key, data), resolve=landed)
        except KeyWrongLastSequenceError as err:
            raise CasConflict(f"{bucket}/{key} changed since revision {revision}") from err
        except Exception as err:  # create() on an existing key
            if "key exists" in str(err).lower() or "wrong last sequence" in str(err).lower():
                raise CasConflict(f"{bucket}/{key} already exists") from err
            raise

    async def create_or_get(self, bucket: str, key: str, value: M) -> tuple[M, int, bool]:
        """Store ``value`` unless the key holds something already: (what is stored, its revision,
        whether this call created it). Of two writers racing, the first one's value stands for both."""
        try:
            revision = await self.kv_put(bucket, key, value, revision=0)
        except CasConflict:
            stored, revision = await self.kv_get(bucket, key, type(value))
            return (stored or value), revision, False
        return value, revision, True

    async def kv_values(self, bucket: str, model: type[M]) -> dict[str, M]:
        """Every value in ``bucket`` by key (keys deleted meanwhile are left out)."""
        found: dict[str, M] = {}
        await self.kv(bucket)  # created if missing
        for key in await kv_keys(self.nc, bucket):  # not kv.keys(): it misses keys written meanwhile
            value, _ = await self.kv_get(bucket, key, model)
            if value is not None:
                found[key] = value
        return found

    async def scenario(self, run_id: str) -> Scenario | None:
        """The scenario bound to the run, or None for a run submitted without one. The planner binds it at
        submit, before the run starts, and nothing changes it afterwards: cached per run, either way."""
        if run_id not in self._scenarios:
            scenario, _ = await self.kv_get(S.KV_SCENARIOS, run_id, Scenario)
            self._scenarios[run_id] = scenario
            while len(self._scenarios) > SCENARIOS_KEPT:
                self._scenarios.popitem(last=False)
        return self._scenarios[run_id]


class Unchanged(Generic[R]):
    """Returned by an ``update`` change function that has nothing to write."""

    def __init__(self, result: R) -> None:
        self.result = result


def expect_stream(subject: str, headers: dict[str, str]) -> None:
    """Name the stream a publish must land in (``Nats-Expected-Stream``), as ``js.publish(stream=)`` does."""
    stream = S.stream_for(subject)
    if stream is not None:
        headers[EXPECTED_STREAM_HEADER] = stream


def consumer_config(spec: ConsumerSpec, settings: Settings) -> ConsumerConfig:
    """The one consumer config: what ``loopwarden bootstrap`` creates and a service expects."""
    return ConsumerConfig(
        durable_name=spec.durable,
        ack_policy=JsAckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.ALL,
        ack_wait=settings.ack_wait_s,
        max_deliver=settings.max_deliver + 2,  # we dead-letter at max_deliver ourselves
        filter_subjects=list(spec.filter_subjects),
        max_ack_pending=settings.ack_pending_for(spec.service),
    )


def consumer_drift(actual: ConsumerConfig, wanted: ConsumerConfig) -> str:
    """What differs between a consumer's stored config and the declared one ('' if nothing)."""
    diffs = []
    actual_filters = sorted(actual.filter_subjects or ([actual.filter_subject] if actual.filter_subject else []))
    if actual_filters != sorted(wanted.filter_subjects or []):
        diffs.append(f"filter {actual_filters} != {sorted(wanted.filter_subjects or [])}")
    for name in ("ack_wait", "max_deliver", "max_ack_pending"):
        got, want = getattr(actual, name), getattr(wanted, name)
        if got is not None and want is not None and abs(float(got) - float(want)) > 1e-6:
            diffs.append(f"{name} {got} != {want}")
    return "; ".join(diffs)


def needed_buckets(service: str) -> tuple[str, ...]:
    """The buckets a service's grant lets it use (waited for at start when managed)."""
    grant = GRANTS.get(service)
    return (*grant.kv_write, *grant.kv_read) if grant else ()


def _not_ready(err: BaseException) -> bool:
    """JetStream is not there yet (no meta leader, stream/consumer/bucket missing), not a bad request."""
    if isinstance(err, NotFoundError | NoRespondersError | NoStreamResponseError | NatsTimeoutError | TimeoutError):
        return True
    return isinstance(err, APIError) and (err.code or 0) >= 500


async def until_ready(service: str, what: str, attempt: Callable[[], Awaitable[R]], give_up_after: float = 0) -> R:
    """Call ``attempt`` until it succeeds while the failure means "not ready yet"."""
    started = last_log = time.monotonic()
    delay = 0.1
    while True:
        try:
            return await attempt()
        except Exception as err:
            if not _not_ready(err):
                raise
            waited = time.monotonic() - started
            if give_up_after and waited >= give_up_after:
                raise InfrastructureNotReady(
                    f"{service}: {what} not ready after {waited:.0f}s (LW_INFRA_WAIT_S; "
                    f"has `loopwarden bootstrap` run?): {describe_nats_error(err)}"
                ) from err
            if time.monotonic() - last_log >= 5.0 or waited == 0:
                log.warning("%s: waiting for %s (%s)", service, what, describe_nats_error(err))
                last_log = time.monotonic()
        await asyncio.sleep(delay)
        delay = min(delay * 2, 2.0)


def describe_nats_error(err: BaseException) -> str:
    if isinstance(err, APIError):
        return f"{err.description or type(err).__name__} (code {err.code}, err_code {err.err_code})"
    return repr(err) if str(err) else type(err).__name__


def stream_config(name: str, settings: Settings) -> StreamConfig:
    if name == S.STREAM_PAYLOADS:
        return payload_stream_config(settings)
    return StreamConfig(
        name=name,
        subjects=S.STREAM_SUBJECTS[name],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        # What a client or an operator sends again (LW_SUBMIT) is kept for a longer window than what only a
        # redelivered handler publishes again: nats-server holds each id of the window in memory.
        duplicate_window=settings.duplicate_window_s if name == S.STREAM_SUBMIT else settings.redelivery_dedupe_s,
        max_age=settings.evt_max_age_s if name == S.STREAM_EVT else settings.stream_max_age_s,
        num_replicas=settings.stream_replicas,
        allow_direct=True,
    )


async def ensure_streams(js: JetStreamContext, settings: Settings, *, update: bool = False) -> list[str]:
    """Create the streams that are missing. Only with ``update`` (``loopwarden bootstrap``, as
    admin) is an existing stream changed to the declared settings: a service or client that
    connects never rewrites what the operator set (replicas above all). Returns what changed."""
    changed = []
    missing = []
    # Existing streams first: a stream that gave up subjects (LW_CMD's submits and requeues, now LW_SUBMIT's)
    # must have let go of them before the stream that takes them is created.
    for name in S.STREAM_SUBJECTS:
        cfg = stream_config(name, settings)
        try:
            info = await js.stream_info(name)
        except NotFoundError:
            missing.append(cfg)
            continue
        if update and _stream_differs(info.config, cfg):
            await js.update_stream(cfg)
            changed.append(f"updated stream {name} (replicas {info.config.num_replicas} -> {cfg.num_replicas})")
    for cfg in missing:
        try:
            await js.add_stream(cfg)
            changed.append(f"created stream {cfg.name} (replicas {cfg.num_replicas})")
        except APIError as err:  # another process created it in between
            if "already in use" not in str(err):
                raise
    return changed


def _stream_differs(actual: StreamConfig, wanted: StreamConfig) -> bool:
    return any(
        getattr(actual, f) != getattr(wanted, f)
        for f in ("subjects", "duplicate_window", "max_age", "num_replicas", "allow_direct", "max_bytes")
        if getattr(wanted, f) is not None  # not declared: the server's default stands
    )


async def kv_keys(nc: NatsClient, bucket: str, timeout: float = 5.0) -> list[str]:
    """Every key of a bucket, from the server's index of the subjects its stream holds (one request per
    100,000 keys, no consumer). A key deleted or purged by a marker is listed too: reading it says so.

    A listing by watching the bucket until nothing more is pending (nats-py's ``KeyValue.keys``, or its
    watcher) misses a key written while it runs: measured, 9 listings in 100 of a 400-key bucket under
    concurrent writes came back one key short (the retention sweep then took a run for one without a
    queue item and purged its audit trail). ``KeyValue.keys`` also leaves its consumer on the server for
    5 minutes, and nats-server caps a stream at 1,000 consumers."""
    prefix = f"$KV.{bucket}."
    keys: list[str] = []
    while True:
        request = json.dumps({"subjects_filter": f"{prefix}>", "offset": len(keys)}).encode()
        reply = await nc.request(f"$JS.API.STREAM.INFO.KV_{bucket}", request, timeout=timeout)
        info = json.loads(reply.data)
        if "error" in info:
            APIError.from_error(info["error"])  # raises: NotFoundError for a bucket never created
        page = (info.get("state") or {}).get("subjects") or {}
        keys += [subject[len(prefix) :] for subject in page]
        if not page or len(keys) >= int(info.get("total") or 0):
            return keys


# --- reading a stream without a consumer (batched direct gets) -----------------------------------------
SCAN_BATCH = 256  # messages per batched direct get
SCAN_MAX_BYTES = 8 * 1024 * 1024  # and at most this much per answer (the server stops the batch there)
_DIRECT_HEADERS = (
    "Nats-Stream",
    "Nats-Subject",
    "Nats-Sequence",
    "Nats-Time-Stamp",
    "Nats-Num-Pending",
    "Nats-Last-Sequence",
)


@dataclass(frozen=True)
class Stored:
    """A message as a stream stores it, read by direct get: its subject, sequence, time, headers as
    published (the direct get's own ``Nats-*`` headers taken out) and body."""

    subject: str
    seq: int
    time: datetime | None
    headers: dict[str, str]
    data: bytes


def _stored(msg: Msg) -> Stored:
    headers = dict(msg.headers or {})
    subject = headers.get("Nats-Subject", "")
    seq = int(headers.get("Nats-Sequence") or 0)
    stamp = headers.get("Nats-Time-Stamp")
    for name in _DIRECT_HEADERS:
        headers.pop(name, None)
    at = None
    if stamp:
        with contextlib.suppress(ValueError):  # RFC 3339 with nanoseconds: keep microseconds
            head, _, frac = stamp.rstrip("Z").partition(".")
            at = datetime.fromisoformat(f"{head}.{(frac + '000000')[:6]}+00:00" if frac else f"{head}+00:00")
    return Stored(subject, seq, at, headers, bytes(msg.data or b""))


async def _direct_batch(nc: NatsClient, stream: str, request: dict[str, Any], timeout: float) -> tuple[list[Msg], int]:
    """One batched direct get (``$JS.API.DIRECT.GET.<stream>``, nats-server 2.11+): the messages, then the
    ``204 EOB`` status that ends them and says how many more match (``Nats-Num-Pending``). No match: 404."""
    inbox = nc.new_inbox()  # under this user's inbox prefix (permissions)
    queue: asyncio.Queue[Msg] = asyncio.Queue()

    async def on_msg(msg: Msg) -> None:
        await queue.put(msg)

    sub = await nc.subscribe(inbox, cb=on_msg)
    got: list[Msg] = []
    try:
        await nc.publish(f"$JS.API.DIRECT.GET.{stream}", json.dumps(request).encode(), reply=inbox)
        async with asyncio.timeout(timeout):
            while True:
                msg = await queue.get()
                status = msg.headers.get("Status") if msg.headers else None
                if not status:
                    got.append(msg)
                    continue
                if status == "204":
                    return got, int(msg.headers.get("Nats-Num-Pending") or 0)  # type: ignore[union-attr]
                if status == "404":
                    return got, 0
                if status == "503":
                    raise NoRespondersError
                APIError.from_msg(msg)  # raises
                raise APIError(description=f"direct get on {stream}: status {status}")
    except TimeoutError:
        raise NatsTimeoutError from None
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


async def scan(
    nc: NatsClient, stream: str, subjects: str, start: int = 1, *, batch: int = SCAN_BATCH, timeout: float = 5.0
) -> list[Stored]:
    """The messages ``stream`` holds on ``subjects`` (one filter, wildcards allowed) from sequence ``start``
    on, oldest first: batched direct gets, so a reader needs no consumer - and so no right to create one
    on a stream that holds the services' durables (nats-server takes a create naming an existing durable
    as an update of it). A stream that is missing raises ``NotFoundError``."""
    out: list[Stored] = []
    seq = start
    while True:
        request = {"seq": seq, "next_by_subj": subjects, "batch": batch, "max_bytes": SCAN_MAX_BYTES}
        msgs, pending = await _direct_batch(nc, stream, request, timeout)
        out += [_stored(m) for m in msgs]
        if not msgs or not pending:
            return out
        seq = out[-1].seq + 1


async def scan_page(
    nc: NatsClient,
    stream: str,
    subjects: str,
    start: int = 1,
    *,
    batch: int = SCAN_BATCH,
    max_bytes: int = SCAN_MAX_BYTES,
    timeout: float = 5.0,
) -> tuple[list[Stored], int]:
    """One batch of ``scan``: the messages on ``subjects`` from ``start`` (at most ``batch``, and the server
    stops at ``max_bytes``), and how many more match after them."""
    request = {"seq": start, "next_by_subj": subjects, "batch": batch, "max_bytes": max_bytes}
    msgs, pending = await _direct_batch(nc, stream, request, timeout)
    return [_stored(m) for m in msgs], pending


async def scan_all(nc: NatsClient, stream: str, filters: list[str], start: int = 1, **kw: Any) -> list[Stored]:
    """``scan`` for several filters that never overlap (e.g. ``S.run_filters``), merged in stream order."""
    found = [m for f in filters for m in await scan(nc, stream, f, start, **kw)]
    return sorted(found, key=lambda m: m.seq)


async def kv_scan(nc: NatsClient, bucket: str, keys: str = ">", start: int = 1) -> tuple[dict[str, Stored | None], int]:
    """The values of a bucket's keys matching ``keys`` written from ``start`` on, by key (None: deleted or
    purged since), and the last sequence read (0: none): a listing and a watch without a consumer."""
    prefix = f"$KV.{bucket}."
    found: dict[str, Stored | None] = {}
    last = 0
    for m in await scan(nc, f"KV_{bucket}", prefix + keys, start):
        deleted = m.headers.get(KV_OP_HEADER) in ("DEL", "PURGE")
        found[m.subject[len(prefix) :]] = None if deleted else m
        last = m.seq
    return found, last


# Revisions kept per key. Nothing reads an older revision of a key (every write is a CAS on the current
# one), so one is kept; the tool ledger keeps both of its two writes (created, final) for inspection.
KV_HISTORY: dict[str, int] = {S.KV_TOOL_LEDGER: 2, S.KV_ESCALATIONS: 5}


def kv_history(bucket: str) -> int:
    return KV_HISTORY.get(bucket, 1)


# Buckets whose entries expire (seconds; the others keep theirs). A console revocation need outlive only the
# longest session it revokes (``console_session_s`` is capped at this).
KV_MAX_AGE_S: dict[str, float] = {S.KV_CONSOLE_SESSIONS: 24 * 3600.0}


async def ensure_buckets(
    js: JetStreamContext, settings: Settings, buckets: list[str] | None = None, *, update: bool = False
) -> list[str]:
    """Create the buckets that are missing; with ``update`` (bootstrap) set existing ones to the
    declared replica count. Returns what changed."""
    changed = []
    for bucket in buckets or S.ALL_BUCKETS:
        try:
            await js.key_value(bucket)
        except BucketNotFoundError:
            try:
                await js.create_key_value(
                    KeyValueConfig(
                        bucket=bucket,
                        history=kv_history(bucket),
                        ttl=KV_MAX_AGE_S.get(bucket),
                        storage=StorageType.FILE,
                        replicas=settings.kv_replicas,
                        direct=True,
                    )
                )
                changed.append(f"created bucket {bucket} (replicas {settings.kv_replicas})")
            except APIError as err:  # another process created it in between
                if "already in use" not in str(err):
                    raise
            continue
        if update:
            info = await js.stream_info(f"KV_{bucket}")
            if info.config.num_replicas != settings.kv_replicas:
                before = info.config.num_replicas
                await js.update_stream(info.config.evolve(num_replicas=settings.kv_replicas))
                changed.append(f"updated bucket {bucket} (replicas {before} -> {settings.kv_replicas})")
            if info.config.max_msgs_per_subject != kv_history(bucket):
                before = info.config.max_msgs_per_subject
                info = await js.stream_info(f"KV_{bucket}")
                await js.update_stream(info.config.evolve(max_msgs_per_subject=kv_history(bucket)))
                changed.append(f"updated bucket {bucket} (history {before} -> {kv_history(bucket)})")
    return changed


async def ensure_consumers(js: JetStreamContext, settings: Settings, specs: list[ConsumerSpec]) -> list[str]:
    """Create or update each declared durable consumer (bootstrap). Returns what changed."""
    changed = []
    for spec in specs:
        wanted = consumer_config(spec, settings)
        try:
            info = await js.consumer_info(spec.stream, spec.durable)
        except NotFoundError:
            await js.add_consumer(spec.stream, wanted)
            changed.append(f"created consumer {spec.stream}/{spec.durable}")
            continue
        drift = consumer_drift(info.config, wanted)
        if drift:
            await js.add_consumer(spec.stream, wanted)
            changed.append(f"updated consumer {spec.stream}/{spec.durable} ({drift})")
    return changed
