"""Bounds reach existing deployments: ``loopwarden bootstrap`` gives streams and buckets created by an earlier
release (no byte bound) their bounds and discard policies, and refuses, in one line naming the setting, to lower
a bound below what a stream holds (nats-server would drop the oldest messages to fit)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from nats.js.api import DiscardPolicy, StreamConfig

from loopwarden.client import Client
from loopwarden.infra import bootstrap
from loopwarden.stack import LocalStack
from shared import subjects as S
from shared.settings import Settings
from tests.support.paths import ROOT
from tests.support.timing import bound

MIB = 1024 * 1024


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    stack = LocalStack(state_dir=tmp_path / "nats", services=())
    stack.start()
    try:
        yield str(stack.nats_url)
    finally:
        stack.stop()


def cli_bootstrap(url: str, **env: str) -> subprocess.CompletedProcess[str]:
    drop = ("NATS_URL", "LW_NATS_URL", "LW_NATS_USER", "LW_NATS_PASSWORD")
    full = {k: v for k, v in os.environ.items() if k not in drop} | {"LW_NATS_URL": url, **env}
    return subprocess.run(
        [sys.executable, "-m", "loopwarden.cli", "bootstrap"],
        env=full,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=bound(120),
    )


async def test_bootstrap_bounds_the_streams_and_buckets_an_earlier_release_made(server: str) -> None:
    nc = await nats.connect(server)
    try:
        js = nc.jetstream()
        for name in (S.STREAM_SUBMIT, S.STREAM_DLQ):  # as the release before made them: no bound
            await js.add_stream(StreamConfig(name=name, subjects=S.STREAM_SUBJECTS[name], allow_direct=True))
        await bootstrap(Settings(nats_url=server))
        submit = (await js.stream_info(S.STREAM_SUBMIT)).config
        assert submit.max_bytes == 1024 * MIB and submit.max_msgs == 1_000_000 and submit.discard == DiscardPolicy.NEW
        dlq = (await js.stream_info(S.STREAM_DLQ)).config
        assert dlq.max_bytes == 1024 * MIB and dlq.discard == DiscardPolicy.OLD
        runs = (await js.stream_info(f"KV_{S.KV_RUNS}")).config
        assert runs.max_bytes == 1024 * MIB
        replicas = (await js.stream_info(f"KV_{S.KV_REPLICAS}")).config
        assert replicas.max_age == 30.0  # LW_REPLICA_TTL_S: a replica that stops writing is gone
    finally:
        await nc.close()


async def test_bootstrap_never_lowers_a_bound_below_what_a_stream_holds(server: str) -> None:
    await bootstrap(Settings(nats_url=server))
    async with Client(Settings(nats_url=server, manage_streams=False)) as client:
        for _ in range(12):  # 3 MiB of letters
            await client.bus.nc.request(S.dead_letter("planner"), b"x" * (256 * 1024), timeout=bound(5))
        held = (await client.bus.js.stream_info(S.STREAM_DLQ)).state
    done = cli_bootstrap(server, LW_STREAM_MAX_BYTES=json.dumps({"LW_DLQ": 2 * MIB}))
    assert done.returncode == 1, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"loopwarden bootstrap: stream {S.STREAM_DLQ} holds {held.bytes} bytes in 12 messages"), line
    assert "LW_STREAM_MAX_BYTES" in line and "Traceback" not in done.stderr
    async with Client(Settings(nats_url=server, manage_streams=False)) as client:
        after = await client.bus.js.stream_info(S.STREAM_DLQ)
    assert after.state.messages == 12 and after.config.max_bytes == 1024 * MIB  # nothing dropped, nothing lowered
