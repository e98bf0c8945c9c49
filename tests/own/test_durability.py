"""Durability you can choose (issue 28, edge 7): ``LW_NATS_SYNC_INTERVAL`` reaches the nats-server the local
stack starts and the cluster config loopwarden ships, and the real server reads it as meant (``always``:
an fsync on every write before its ack). What each level survives: docs/operations.md, Durability."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

from loopwarden.stack import LocalStack, StackError, free_port, nats_server_binary
from tests.support.paths import ROOT
from tests.support.stacks import running
from tests.support.timing import bound

CLUSTER_CONF = ROOT / "deploy" / "nats" / "cluster.conf"


@pytest.fixture(scope="module")
def always(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """nats-server alone, started by the local stack with every write synced."""
    yield from running(
        LocalStack(
            state_dir=tmp_path_factory.mktemp("sync-always"), env={"LW_NATS_SYNC_INTERVAL": "always"}, services=()
        )
    )


def jetstream_config(args: list[str], store: Path | None, env: dict[str, str] | None = None) -> dict[str, Any]:
    """What a nats-server started with ``args`` (plus its own ports, and ``store`` unless its config names
    one) reports as its JetStream config on its monitoring endpoint."""
    port, http = free_port(), free_port()
    proc = subprocess.Popen(
        [*args, "-a", "127.0.0.1", "-p", str(port), "-m", str(http), *(["-sd", str(store)] if store else [])],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http}/varz", timeout=bound(1)) as resp:
                    config: dict[str, Any] = json.loads(resp.read())["jetstream"]["config"]
                    return config
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(
                        f"nats-server {args} did not answer on /varz (exit code {proc.poll()})"
                    ) from None
                time.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait(bound(10))


def shipped_cluster_conf(where: Path) -> Path:
    """deploy/nats/cluster.conf on loopback with its store in ``where``, without the generated users (the
    JetStream settings do not need them)."""
    where.mkdir(parents=True)
    text = CLUSTER_CONF.read_text().replace("include ./auth.conf", "").replace("0.0.0.0:4222", "127.0.0.1:4222")
    text = text.replace("0.0.0.0:6222", f"127.0.0.1:{free_port()}").replace("store_dir: /data", f'store_dir: "{where}"')
    conf = where / "cluster.conf"
    conf.write_text(text)
    return conf


def started_with(stack: LocalStack) -> list[str]:
    [server] = [p for p in stack.procs if p.name == "nats-server"]
    return Path(f"/proc/{server.popen.pid}/cmdline").read_bytes().decode().rstrip("\0").split("\0")


async def test_the_local_stack_starts_nats_server_syncing_every_write(always: LocalStack, tmp_path: Path) -> None:
    args = started_with(always)
    assert "-c" in args, args
    conf = args[args.index("-c") + 1]
    assert 'sync_interval: "always"' in Path(conf).read_text()  # noqa: ASYNC240 (a small local file)
    # the real server reads that config as an fsync on every write
    config = jetstream_config([nats_server_binary(), "-js", "-c", conf], tmp_path)
    assert config.get("sync_always") is True
    # it offers 1 TB for the bounds' reservations whatever the free disk (docs/operations.md, "Bounds")
    assert config["max_storage"] == 1024**4, config
    assert "sync_always" not in jetstream_config([nats_server_binary(), "-js"], tmp_path / "default")
    # and the stack's server runs JetStream with it
    nc = await nats.connect(always.nats_url)
    try:
        info = await nc.jetstream().account_info()
        assert info.limits is not None
    finally:
        await nc.close()


def test_a_level_the_server_would_misread_stops_the_stack_before_it_starts(tmp_path: Path) -> None:
    stack = LocalStack(state_dir=tmp_path, env={"LW_NATS_SYNC_INTERVAL": "2 min"}, services=())
    with pytest.raises(StackError) as err:
        stack.start()
    assert str(err.value) == (
        "LW_NATS_SYNC_INTERVAL: '2 min' is neither 'always' nor a duration such as 500ms, 1s, 2m or 1h"
    )
    assert stack.procs == []  # nothing was started, so nothing is left running


def test_the_shipped_cluster_config_takes_each_level_from_the_environment(tmp_path: Path) -> None:
    routes = {"LW_NATS_ROUTE_PASSWORD": "r", **{f"LW_NATS_ROUTE_{i}": f"nats://r:r@127.0.0.1:{i}" for i in (1, 2, 3)}}
    for level, always_synced, interval_ns in (("always", True, None), ("120s", None, 120e9), ("1s", None, 1e9)):
        conf = shipped_cluster_conf(tmp_path / level)
        cmd = [nats_server_binary(), "-c", str(conf), "--server_name", "lw-sync-test"]
        env = {**routes, "LW_NATS_SYNC_INTERVAL": level}
        check = subprocess.run(
            [*cmd, "-t"], env={**os.environ, **env}, capture_output=True, text=True, timeout=bound(30)
        )
        assert check.returncode == 0, check.stdout + check.stderr
        config = jetstream_config(cmd, None, env)
        assert config.get("sync_always") is always_synced, (level, config)
        if interval_ns is not None:
            assert config["sync_interval"] == interval_ns, (level, config)
    # why minutes are written as seconds: a bare 2m in a nats config is a size, and the server refuses it
    env = {**os.environ, **routes, "LW_NATS_SYNC_INTERVAL": "2m"}
    cmd = [nats_server_binary(), "-c", str(shipped_cluster_conf(tmp_path / "2m")), "-t"]
    bad = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=bound(30))
    assert bad.returncode != 0 and "sync_interval" in bad.stdout + bad.stderr
