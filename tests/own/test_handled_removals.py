"""A handled message removed by its number (``services.planner.removals.Removals``), against its own nats-server
with two users: one that may delete messages, one whose grant lacks ``$JS.API.STREAM.MSG.DELETE`` (a planner of
this release under the last release's grants). The refused removal leaves the message to the sweep, says so in the
log once and pauses the next; the planner's own work never waits on it."""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest
from nats.js.api import StreamConfig
from nats.js.errors import NotFoundError

from loopwarden.stack import free_port, nats_server_binary, port_in_use
from services.planner.removals import PAUSE_S, Removals
from shared.bus import Bus
from shared.settings import Settings
from tests.support.timing import bound, polls

STREAM = "LWTEST_HANDLED"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root: Path = tmp_path_factory.mktemp("handled-removals")
    port = free_port()
    conf = root / "server.conf"
    conf.write_text(
        f"""listen: "127.0.0.1:{port}"
jetstream {{ store_dir: "{root / "js"}" }}
authorization {{
  users = [
    {{ user: "allowed", password: "pw-allowed" }}
    {{ user: "denied", password: "pw-denied",
       permissions: {{ publish: {{ allow: [">"], deny: ["$JS.API.STREAM.MSG.DELETE.>"] }}, subscribe: ">" }} }}
  ]
}}
"""
    )
    log = (root / "server.log").open("wb")
    proc = subprocess.Popen([nats_server_binary(), "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(polls(100)):
            if port_in_use(port):
                break
            time.sleep(0.05)
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=bound(10))
        log.close()


async def _bus(url: str, user: str) -> Bus:
    settings = Settings(nats_url=url, nats_user=user, nats_password=f"pw-{user}", js_timeout_s=0.5)  # type: ignore[arg-type]
    bus = Bus(settings, "planner")
    await bus.connect()
    return bus


@pytest.fixture
async def stored(server: str) -> AsyncIterator[list[int]]:
    """Three messages in the test stream, by their numbers."""
    nc = await nats.connect(server, user="allowed", password="pw-allowed")
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=STREAM, subjects=["lwtest.handled.>"]))
    seqs = [(await js.publish("lwtest.handled.x", f'{{"n":{n}}}'.encode())).seq for n in range(3)]
    yield seqs
    await js.delete_stream(STREAM)
    await nc.close()


async def _held(url: str, seq: int) -> bool:
    nc = await nats.connect(url, user="allowed", password="pw-allowed")
    try:
        await nc.jetstream().get_msg(STREAM, seq)
        return True
    except NotFoundError:
        return False
    finally:
        await nc.close()


async def test_a_handled_message_is_removed_and_one_gone_already_is_no_failure(server: str, stored: list[int]) -> None:
    bus = await _bus(server, "allowed")
    try:
        removals = Removals(bus, STREAM, "submit")
        removals.remove(stored[0])
        removals.remove(0)  # a dead letter handed back: no stored number, nothing tried
        await removals.idle()
        assert not await _held(server, stored[0]) and await _held(server, stored[1])
        removals.remove(stored[0])  # removed already
        await removals.idle()
        assert removals.failures == 0 and removals.paused_until == 0.0
    finally:
        await bus.stop()


async def test_a_refused_removal_leaves_the_message_says_so_once_and_pauses_the_next(
    server: str, stored: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    bus = await _bus(server, "denied")
    try:
        removals = Removals(bus, STREAM, "submit")
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="loopwarden.planner"):
            removals.remove(stored[1])
            assert time.monotonic() - started < bound(0.1)  # in the background: the handler goes on at once
            await removals.idle()
            for seq in stored[1:]:  # paused: not tried, not logged again
                removals.remove(seq)
            await removals.idle()
        assert removals.failures == 1 and removals.paused_until - time.monotonic() > PAUSE_S - bound(5)
        assert all([await _held(server, seq) for seq in stored])  # left to the sweep
        said = [r.getMessage() for r in caplog.records if "could not remove a handled submit" in r.getMessage()]
        assert len(said) == 1 and "until the retention sweep" in said[0], said
    finally:
        await bus.stop()
