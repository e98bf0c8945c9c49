"""docs/clustering.md's one-machine recipe, as a person follows it: auth.conf from the access file
(``loopwarden config apply --auth-conf``), each node's own config (``loopwarden cluster-config --node N``, no sed,
no port flags), three nats-servers that form a cluster with route authorization, ``loopwarden bootstrap`` as the
admin with three replicas; a server that knows the ports but not the route password does not join."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from loopwarden.stack import free_port, nats_server_binary, port_in_use, wait_for_port
from shared.access import EXAMPLE
from tests.support.paths import ROOT
from tests.support.timing import bound, eventually_sync

USERS = ("admin", "planner", "executor", "validator", "judge", "governor", "escalation", "client", "console")


def _monitor(port: int, endpoint: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/{endpoint}", timeout=bound(2)) as resp:
        data: dict[str, Any] = json.loads(resp.read())
        return data


def _routes(port: int) -> int:
    """How many other servers this node has routes to (a pair of servers may keep a pool of connections)."""
    try:
        return len({r.get("remote_name") for r in _monitor(port, "routez").get("routes") or []})
    except OSError:
        return -1


def _three_free() -> int:
    """A port whose next two are free too (each node's is the first plus N-1)."""
    for _ in range(200):
        base = free_port()
        if not any(port_in_use(base + i) for i in (1, 2)) and base + 2 < 65536:
            with contextlib.ExitStack() as held:
                try:
                    for i in (1, 2):
                        sock = held.enter_context(socket.socket())
                        sock.bind(("127.0.0.1", base + i))
                except OSError:
                    continue
            return base
    raise AssertionError("no three consecutive free ports")


def test_three_nodes_on_one_machine_from_the_generated_configs(tmp_path: Path) -> None:
    root = tmp_path / "nats"
    passwords = {u: f"pw{secrets.token_hex(6)}" for u in (*USERS, *EXAMPLE.tenant_users(), *EXAMPLE.operators)}
    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "LW_NATS_URL", "LW_NATS_USER")}
    env |= {f"LW_NATS_PASSWORD_{u.upper()}": pw for u, pw in passwords.items()}
    env |= {"LW_NATS_ROUTE_PASSWORD": f"route{secrets.token_hex(8)}", "LW_STATE_DIR": str(tmp_path / "state")}
    client, cluster, http = _three_free(), _three_free(), _three_free()
    assert len({*range(client, client + 3), *range(cluster, cluster + 3), *range(http, http + 3)}) == 9

    def lw(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "loopwarden.cli", *args],
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=bound(120),
            cwd=ROOT,
        )
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr
        return done

    applied = lw(
        "config", "apply", str(ROOT / "deploy" / "access.yaml"), "--auth-conf", str(root / "auth.conf"), "--no-store"
    )
    assert "reload every nats-server" in applied.stdout
    ports = ("--client-port", str(client), "--cluster-port", str(cluster), "--http-port", str(http))
    for n in (1, 2, 3):
        lw("cluster-config", "--node", str(n), "--dir", str(root), *ports)
        conf = root / f"n{n}" / "server.conf"
        assert oct(conf.stat().st_mode & 0o777) == "0o600"  # the route password is in it
        checked = subprocess.run([nats_server_binary(), "-t", "-c", str(conf)], env=env, capture_output=True, text=True)
        assert checked.returncode == 0, checked.stderr
    nodes: list[subprocess.Popen[bytes]] = []

    def start_node(n: int) -> None:
        log = (root / f"n{n}" / "server.log").open("wb")
        conf = str(root / f"n{n}" / "server.conf")
        nodes.append(subprocess.Popen([nats_server_binary(), "-c", conf], env=env, stdout=log, stderr=log))
        log.close()
        wait_for_port(client + n - 1)

    try:
        # Bootstrapped as the recipe does, right after starting the nodes, and here before the third is up: the
        # cluster refuses a 3-replica stream for too few peers ("no suitable peers for placement") until it is,
        # and bootstrap asks again (for up to LW_FAILOVER_RETRY_S) instead of failing.
        start_node(1)
        start_node(2)
        servers = ",".join(f"nats://127.0.0.1:{client + n}" for n in range(3))
        admin = {"LW_NATS_URL": servers, "LW_NATS_USER": "admin", "LW_NATS_PASSWORD": passwords["admin"]}
        with ThreadPoolExecutor(1) as pool:
            bootstrap = pool.submit(lw, "bootstrap", **admin, LW_MANAGE_STREAMS="false", LW_STREAM_REPLICAS="3")
            time.sleep(2)  # bootstrap meets two nodes of three: not a bound, the time the third is kept down
            assert not bootstrap.done(), "bootstrap ended with two nodes of three"
            start_node(3)
            done = bootstrap.result()
        for n in (0, 1, 2):
            eventually_sync(lambda n=n: _routes(http + n) == 2, what=f"node {n + 1}'s two routes", within=bound(30))
        assert "(replicas 3)" in done.stdout
        assert _monitor(http, "jsz")["meta_cluster"]["cluster_size"] == 3

        # a server that knows the ports but not the route password does not join
        rogue_port = free_port()
        argv = [nats_server_binary(), "-p", str(free_port()), "--cluster", f"nats://127.0.0.1:{rogue_port}"]
        rogue = subprocess.Popen(
            [*argv, "--routes", f"nats://route:wrong@127.0.0.1:{cluster}", "--server_name", "rogue"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            time.sleep(bound(2))
            assert _routes(http) == 2 and "rogue" not in json.dumps(_monitor(http, "routez"))
        finally:
            rogue.terminate()
            rogue.wait(bound(10))
    finally:
        for node in nodes:
            node.terminate()
        for node in nodes:
            node.wait(bound(10))
