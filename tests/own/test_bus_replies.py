"""The bus's reply collector, against a real nats-server: every JetStream publish and KV request is a
plain publish whose answer one wildcard inbox subscription collects. A PubAck error still raises, a
compare-and-swap on a stale revision is still ``CasConflict``, a deleted key still reads as absent, and
a publish whose PubAck does not come in time is sent again with the same message id (alone and in a
batch) - but one without an id is not (a repeat could store it twice).

The "slow stream" is this test's own core-NATS subscriber on ``bustest.slow.>`` (a subject no stream
holds): it records every attempt, drops the first attempt of each message, and forwards later ones to
``bustest.store.>`` with the bus's own reply subject, so the PubAck comes from JetStream itself."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Literal

import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import DiscardPolicy, StreamConfig
from nats.js.errors import APIError, NotFoundError
from pydantic import BaseModel

from loopwarden.stack import LocalStack
from shared.bus import MSG_ID_HEADER, Bus, CasConflict, ensure_streams, num_delivered, publish_raw
from shared.settings import Settings
from shared.version import SERVICE_HEADER, VERSION_HEADER, package_version
from tests.support.timing import bound, polls

STORE, FULL = "LWTEST_STORE", "LWTEST_FULL"
BUCKET = "lwtest_bus"
JS_TIMEOUT_S = 0.5


class Item(BaseModel):
    n: int
    text: str = ""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    stack = LocalStack(state_dir=tmp_path_factory.mktemp("bus-replies"), services=())
    try:
        yield stack.start()
    finally:
        stack.stop()


@dataclass
class SlowStream:
    """Drops the first attempt of each message, forwards the later ones to the store (``copies``
    times each: a duplicate PubAck the bus must shrug off)."""

    nc: NatsClient
    copies: int = 1
    attempts: list[tuple[str, str | None]] = field(default_factory=list)  # (subject, Nats-Msg-Id)

    async def on_msg(self, msg: Msg) -> None:
        attempt = (msg.subject, (msg.headers or {}).get(MSG_ID_HEADER))
        self.attempts.append(attempt)
        if self.attempts.count(attempt) == 1:
            return  # the first attempt gets no PubAck: the bus times out
        target = msg.subject.replace("bustest.slow.", "bustest.store.", 1)
        for _ in range(self.copies):
            await self.nc.publish(target, msg.data, reply=msg.reply, headers=msg.headers)


@pytest.fixture(scope="module")
async def raw(server: LocalStack) -> AsyncIterator[NatsClient]:
    nc = await nats.connect(server.nats_url)
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=STORE, subjects=["bustest.store.>"], duplicate_window=60))
    await js.add_stream(StreamConfig(name=FULL, subjects=["bustest.full.>"], max_msgs=1, discard=DiscardPolicy.NEW))
    yield nc
    await nc.close()


@pytest.fixture
async def slow(raw: NatsClient) -> AsyncIterator[SlowStream]:
    stream = SlowStream(raw)
    sub = await raw.subscribe("bustest.slow.>", cb=stream.on_msg)
    await raw.flush()  # the server knows the subscriber before the bus publishes
    yield stream
    await sub.unsubscribe()


@pytest.fixture(scope="module")
async def bus(server: LocalStack, raw: NatsClient) -> AsyncIterator[Bus]:
    settings = Settings(nats_url=server.nats_url, js_timeout_s=JS_TIMEOUT_S, failover_retry_s=5)
    b = Bus(settings, "bustest")
    await b.connect()
    yield b
    await b.stop()


async def stored(raw: NatsClient, subject: str) -> list[bytes]:
    """Every message the store holds on ``subject``, oldest first."""
    js = raw.jetstream()
    sub = await js.pull_subscribe(subject, stream=STORE)
    out: list[bytes] = []
    try:
        while True:
            try:
                msgs = await sub.fetch(10, timeout=bound(0.3))
            except TimeoutError:  # nats-py's own, or asyncio's when its wait for a first message expires
                return out
            out.extend(m.data for m in msgs)
    finally:
        await sub.unsubscribe()


async def test_a_pubacks_error_raises_alone_and_in_a_batch(bus: Bus, raw: NatsClient) -> None:
    await bus.publish("bustest.full.a", Item(n=1), msg_id="full-1")  # the stream's one message
    with pytest.raises(APIError) as single:
        await bus.publish("bustest.full.b", Item(n=2), msg_id="full-2")
    assert "maximum messages" in str(single.value.description).lower()
    items = [("bustest.store.batch-ok", b'{"n": 3}', "ok-3"), ("bustest.full.c", b'{"n": 4}', "full-4")]
    with pytest.raises(APIError):
        await bus.publish_all(items)
    assert await stored(raw, "bustest.store.batch-ok") == [b'{"n": 3}']  # the good one is stored once
    assert not bus._replies.waiting  # nothing left waiting for an answer


async def test_compare_and_swap_conflicts_and_direct_reads(bus: Bus) -> None:
    key = "cas.one"
    assert await bus.kv_get(BUCKET, key, Item) == (None, 0)
    first = await bus.kv_put(BUCKET, key, Item(n=1), revision=0)
    assert await bus.kv_get(BUCKET, key, Item) == (Item(n=1), first)
    with pytest.raises(CasConflict):  # create on a key that exists
        await bus.kv_put(BUCKET, key, Item(n=2), revision=0)
    second = await bus.kv_put(BUCKET, key, Item(n=2), revision=first)
    assert second > first
    with pytest.raises(CasConflict):  # a stale revision
        await bus.kv_put(BUCKET, key, Item(n=3), revision=first)
    assert await bus.kv_get(BUCKET, key, Item) == (Item(n=2), second)
    plain = await bus.kv_put(BUCKET, key, Item(n=4))  # no revision: a plain put
    assert await bus.kv_get(BUCKET, key, Item) == (Item(n=4), plain)
    # A deleted key reads as absent, and a create over its delete marker succeeds (as nats-py's create).
    kv = await bus.kv(BUCKET)
    await kv.delete(key)
    assert await bus.kv_get(BUCKET, key, Item) == (None, 0)
    again = await bus.kv_put(BUCKET, key, Item(n=5), revision=0)
    assert await bus.kv_get(BUCKET, key, Item) == (Item(n=5), again)
    # update(): a read-modify-write that loses a race re-reads and applies again.
    await bus.kv_put(BUCKET, key, Item(n=6), revision=again)  # another writer, after our "known" read
    result = await bus.update(
        BUCKET, key, Item, lambda cur: (Item(n=(cur.n if cur else 0) + 1), "done"), known=(Item(n=5), again)
    )
    assert result == "done"
    assert (await bus.kv_get(BUCKET, key, Item))[0] == Item(n=7)


async def test_a_timed_out_publish_is_sent_again_with_the_same_message_id(
    bus: Bus, raw: NatsClient, slow: SlowStream
) -> None:
    slow.copies = 2  # the re-sent message is stored once and acked twice: the extra PubAck is dropped
    await bus.publish("bustest.slow.one", Item(n=1), msg_id="slow-one")
    assert slow.attempts == [("bustest.slow.one", "slow-one"), ("bustest.slow.one", "slow-one")]
    assert await stored(raw, "bustest.store.one") == [b'{"n":1}']
    assert not bus._replies.waiting


async def test_a_batch_resends_only_what_timed_out_with_the_same_ids(
    bus: Bus, raw: NatsClient, slow: SlowStream
) -> None:
    items = [
        ("bustest.store.b1", b'{"n": 1}', "b1"),
        ("bustest.slow.b2", b'{"n": 2}', "b2"),
        ("bustest.store.b3", b'{"n": 3}', "b3"),
    ]
    await bus.publish_all(items)
    assert slow.attempts == [("bustest.slow.b2", "b2"), ("bustest.slow.b2", "b2")]
    for name, body in (("b1", b'{"n": 1}'), ("b2", b'{"n": 2}'), ("b3", b'{"n": 3}')):
        assert await stored(raw, f"bustest.store.{name}") == [body]
    assert not bus._replies.waiting


async def test_a_timed_out_publish_without_an_id_is_not_repeated(bus: Bus, raw: NatsClient, slow: SlowStream) -> None:
    with pytest.raises(NatsTimeoutError):
        await bus.publish("bustest.slow.noid", Item(n=1))
    with pytest.raises(NatsTimeoutError):
        await bus.publish_all([("bustest.slow.noid2", b"{}", None), ("bustest.store.noid3", b"{}", "x3")])
    assert [s for s, _ in slow.attempts] == ["bustest.slow.noid", "bustest.slow.noid2"]
    assert await stored(raw, "bustest.store.noid") == []
    assert not bus._replies.waiting


def test_num_delivered_reads_the_ack_subject_as_nats_py_does() -> None:
    v1 = "$JS.ACK.LW_CMD.planner_advance.3.120.45.1764530000000000000.0"
    v2 = "$JS.ACK.hub.ACCHASH.LW_CMD.planner_advance.4.120.45.1764530000000000000.0.tok"
    for reply in (v1, v2):
        assert num_delivered(reply) == Msg(_client=None, reply=reply).metadata.num_delivered  # type: ignore[arg-type]
    assert [num_delivered(r) for r in (None, "", "_INBOX.x.y", "$JS.ACK.a.b.x.1.1.1.0")] == [1, 1, 1, 1]


async def test_headers_written_in_one_go_arrive_as_nats_py_writes_them(bus: Bus, raw: NatsClient) -> None:
    """``publish_raw`` (the fast header block) and ``nc.publish`` (its fallback: here a value with a
    line break) store the same headers; the message id still de-duplicates a repeat."""
    headers = {"content-type": "application/json", MSG_ID_HEADER: "hdr-1", "Lw-Run-Id": "run-x", "X-Pad": "  a b  "}
    await publish_raw(bus.nc, "bustest.store.hdr", b"{}", raw.new_inbox(), dict(headers))
    await raw.publish("bustest.store.hdr", b"{}", headers={**headers, MSG_ID_HEADER: "hdr-2"})
    await publish_raw(
        bus.nc, "bustest.store.hdr", b"{}", raw.new_inbox(), {**headers, MSG_ID_HEADER: "hdr-3", "X-Pad": "a\nb"}
    )
    await bus.publish("bustest.store.hdr", b"{}", msg_id="hdr-1")  # a repeat of the first: dropped
    js = raw.jetstream()
    sub = await js.pull_subscribe("bustest.store.hdr", stream=STORE)
    try:
        msgs = await sub.fetch(10, timeout=bound(1))
    finally:
        await sub.unsubscribe()
    got = {
        (m.headers or {}).get(MSG_ID_HEADER): {k: v for k, v in (m.headers or {}).items() if k != MSG_ID_HEADER}
        for m in msgs
    }
    assert len(msgs) == 3 and sorted(got) == ["hdr-1", "hdr-2", "hdr-3"]  # two connections: any order
    assert got["hdr-1"] == got["hdr-2"] == {"content-type": "application/json", "Lw-Run-Id": "run-x", "X-Pad": "a b"}
    assert got["hdr-3"] == {
        "content-type": "application/json",
        "Lw-Run-Id": "run-x",
        "X-Pad": "a b",
    }  # newline -> space


async def _asked_until_answered(nc: NatsClient, subject: str, body: bytes, within: float = bound(30.0)) -> Msg:
    """The answer to a request, asked again while no responder is there yet (a loaded machine: the responder's
    subscription reached the server's interest graph late), for at most ``within`` seconds."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        try:
            return await nc.request(subject, body, timeout=bound(5))
        except NoRespondersError:
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"no responder on {subject} within {within:.0f}s") from None
            await asyncio.sleep(0.1)


async def test_a_responder_answers_inboxes_only(server: LocalStack, raw: NatsClient, bus: Bus) -> None:
    """A reply subject is where the responder writes: one naming a stream subject (or a KV key) would make
    it write there with its own rights (issue 23, D2). It answers ``_INBOX_…`` replies and drops the rest
    (counted, not dead-lettered), as it drops what reaches it on another subject (a push delivery)."""
    responder = Bus(Settings(nats_url=server.nats_url, js_timeout_s=JS_TIMEOUT_S), "bustest_rpc")

    @responder.responder(subject="bustest.rpc.echo", model=Item, reply=lambda reason: Item(n=-1, text=reason))
    async def echo(item: Item) -> Item:
        return Item(n=item.n + 1)

    await responder.start()
    await responder.nc.flush()  # subscribed on the server before we ask
    try:
        answer = await _asked_until_answered(raw, "bustest.rpc.echo", b'{"n": 2}')  # nats-py's inbox: _INBOX.…
        assert Item.model_validate_json(answer.data) == Item(n=3)
        # a reply is a message the service publishes: it says who answered, at which release (issue 29)
        assert answer.headers == {VERSION_HEADER: package_version(), SERVICE_HEADER: "bustest_rpc"}
        # the responder is there now (it answered): a request whose reply names a stream subject is dropped
        await raw.publish("bustest.rpc.echo", b'{"n": 1}', reply="bustest.store.reflected")
        await raw.flush()
        for _ in range(polls(50)):
            if responder.dropped_requests:
                break
            await asyncio.sleep(0.1)
        assert responder.dropped_requests >= 1
        assert await stored(raw, "bustest.store.reflected") == []
    finally:
        await responder.stop()


# --- what a publish stores: in the stream its subject belongs to, and what may be removed once handled ---------


class Lean(BaseModel):
    kind: Literal["lean"] = "lean"  # a tag: written even at its default
    n: int
    note: str | None = None  # at its default: not written
    tags: list[str] = []


async def test_a_publish_stored_by_another_stream_than_its_subjects_raises_naming_both(
    bus: Bus, raw: NatsClient
) -> None:
    """The stream a publish lands in is checked on its PubAck (no ``Nats-Expected-Stream`` header stored with
    every message): here LW_EVT is gone and a foreign stream holds its subjects."""
    js = raw.jetstream()
    await js.delete_stream("LW_EVT")
    await js.add_stream(StreamConfig(name="LWTEST_FOREIGN", subjects=["lw.v1.evt.>"]))
    try:
        with pytest.raises(APIError) as alone:
            await bus.publish("lw.v1.evt.run.started", Lean(n=1), msg_id="foreign-1", run_id="run-f")
        assert "stored in stream LWTEST_FOREIGN, not LW_EVT" in str(alone.value.description)
        with pytest.raises(APIError) as batch:
            await bus.publish_all([("lw.v1.evt.run.decided", b"{}", "foreign-2"), ("bustest.store.ok", b"{}", "ok-f")])
        assert "not LW_EVT" in str(batch.value.description)
        stored_msg = await js.get_msg("LWTEST_FOREIGN", seq=1)
        assert stored_msg.headers is not None and "Nats-Expected-Stream" not in stored_msg.headers
    finally:
        await js.delete_stream("LWTEST_FOREIGN")
        await ensure_streams(js, bus.settings)
    ack = await bus.publish("bustest.store.where", Lean(n=2), msg_id="where-1")  # a subject no LW stream names
    assert ack.stream == STORE


async def test_a_message_is_stored_without_its_defaults_but_its_tags_and_removed_by_its_number(
    bus: Bus, raw: NatsClient
) -> None:
    js = raw.jetstream()
    ack = await bus.publish("bustest.store.lean", Lean(n=3), msg_id="lean-1")
    msg = await js.get_msg(STORE, seq=ack.seq)
    assert msg.data == b'{"n":3,"kind":"lean"}' and Lean.model_validate_json(msg.data) == Lean(n=3)
    await bus.remove(STORE, ack.seq)
    with pytest.raises(NotFoundError):
        await js.get_msg(STORE, seq=ack.seq)
    again = await bus.publish("bustest.store.lean", Lean(n=3), msg_id="lean-1")  # the id outlives the message
    assert again.duplicate
    with pytest.raises(APIError):  # gone already: the server says so
        await bus.remove(STORE, ack.seq)
