"""One node's nats-server config of a cluster on one machine (``loopwarden cluster-config --node N``).

``deploy/nats/cluster.conf`` is the containers' (one node per host, the same ports everywhere, the node's name
from ``--server_name``); on one machine each node needs its own ports and store, and overriding them with
nats-server's flags is a trap: ``--cluster nats://...`` replaces the config's whole ``cluster`` block, route
authorization included, so any server could join. This writes each node's file instead: its client, route
and monitoring ports (``base + N - 1``), its store, its name, the route user's password and the other nodes'
route URLs carrying it (the file is the node's secret: mode 600), and ``include`` of the shared ``auth.conf``
(a path relative to the node's file: nats-server reads an include relative to the including file).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CLIENT_PORT, CLUSTER_PORT, HTTP_PORT = 4222, 6222, 8222


@dataclass(frozen=True)
class Layout:
    """Where the nodes of a one-machine cluster listen and keep their stores."""

    nodes: int = 3
    host: str = "127.0.0.1"
    client_port: int = CLIENT_PORT
    cluster_port: int = CLUSTER_PORT
    http_port: int = HTTP_PORT
    root: Path = Path("/var/lib/loopwarden/nats")

    def node_dir(self, n: int) -> Path:
        return self.root / f"n{n}"

    def client_url(self, n: int) -> str:
        return f"nats://{self.host}:{self.client_port + n - 1}"

    def servers(self) -> str:
        """``LW_NATS_URL`` for every process: all the nodes."""
        return ",".join(self.client_url(n) for n in range(1, self.nodes + 1))


def node_config(layout: Layout, n: int, route_password: str, auth_conf: Path, sync_interval: str | None = None) -> str:
    """Node ``n``'s config (1-based). ``auth_conf``: the generated auth.conf every node includes."""
    if not 1 <= n <= layout.nodes:
        raise ValueError(f"--node {n}: the cluster has nodes 1 to {layout.nodes}")
    if not route_password or any(c in route_password for c in "@/:\"' \\") or route_password.isdigit():
        raise ValueError(
            "LW_NATS_ROUTE_PASSWORD: set it (letters and digits; not all digits, which nats-server reads as a number)"
        )
    here = layout.node_dir(n)
    include = os.path.relpath(auth_conf.resolve() if auth_conf.is_absolute() else auth_conf, here)
    routes = [
        f'"nats://route:{route_password}@{layout.host}:{layout.cluster_port + m - 1}"'
        for m in range(1, layout.nodes + 1)
        if m != n
    ]
    from loopwarden.stack import jetstream_limits  # three nodes on one disk: each offers what a local stack does

    return "\n".join(
        [
            f"# node {n} of {layout.nodes} on one machine (docs/clustering.md): `loopwarden cluster-config --node {n}`",
            "# It holds the route password: keep it private (mode 600). Start: nats-server -c <this file>",
            f'server_name: "lw-n{n}"',
            f'listen: "{layout.host}:{layout.client_port + n - 1}"',
            f'http: "127.0.0.1:{layout.http_port + n - 1}"',
            f'jetstream {{ store_dir: "{here / "jetstream"}", {jetstream_limits(sync_interval or None)} }}',
            "cluster {",
            "  name: loopwarden",
            f'  listen: "{layout.host}:{layout.cluster_port + n - 1}"',
            f'  authorization {{ user: route, password: "{route_password}", timeout: 2 }}',
            f"  routes: [{', '.join(routes)}]",
            "}",
            f'include "{include}"',
            "",
        ]
    )
