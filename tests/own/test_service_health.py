"""The health endpoint the deploy files rely on (``tests/repo/test_deploy.py``), driven end to end: a real service
process is live but not ready before NATS answers, ready once consuming, not ready again when its server dies, and
``python -m shared.health`` (the compose check) exits accordingly; a taken health port stops the service naming
the setting.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loopwarden.stack import free_port, nats_server_binary, wait_for_port
from shared.health import check
from shared.version import package_version
from tests.support.paths import ROOT
from tests.support.timing import bound


@pytest.fixture
def private_nats(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    server = subprocess.Popen(
        [nats_server_binary(), "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(tmp_path / "js")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port)
        yield f"nats://127.0.0.1:{port}", server
    finally:
        server.kill()
        server.wait(timeout=bound(10))


def start_service(name: str, nats_url: str, health_port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "LW_NATS_URL": nats_url,
        "LW_HEALTH_PORT": str(health_port),
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", f"services.{name}"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )


def wait_until(predicate: Any, timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"{what} after {timeout:.0f}s; service log:\n{log.read_text()[-3000:]}")


def health_command(port: int, *extra: str) -> subprocess.CompletedProcess[str]:
    """What the compose health check runs."""
    return subprocess.run(
        [sys.executable, "-m", "shared.health", "--port", str(port), *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=bound(60),
    )


def test_a_service_is_live_at_once_ready_once_consuming_and_not_ready_without_nats(
    tmp_path: Path, private_nats: tuple[str, subprocess.Popen[bytes]]
) -> None:
    nats_url, server = private_nats
    # 1. pointed at a server that is not there: it answers /livez, and /readyz says it is starting
    dead = f"nats://127.0.0.1:{free_port()}"
    port, log = free_port(), tmp_path / "governor-dead.log"
    proc = start_service("governor", dead, port, log)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: check(f"{base}/livez")[0], bound(60), "no /livez", log)
        ok, said = check(f"{base}/readyz")
        assert not ok and json.loads(said) == {
            "service": "governor",
            "version": package_version(),
            "ready": False,
            "detail": "starting: connecting to NATS and creating consumers",
        }
        assert health_command(port).returncode == 1
        assert health_command(port, "--live").returncode == 0
    finally:
        proc.terminate()
        proc.wait(timeout=bound(30))

    # 2. against a real server: ready once it consumes; the compose check passes
    port, log = free_port(), tmp_path / "governor.log"
    proc = start_service("governor", nats_url, port, log)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: check(f"{base}/readyz")[0], bound(90), "never ready", log)
        assert "loopwarden-governor ready" in log.read_text()
        done = health_command(port)
        assert done.returncode == 0 and json.loads(done.stdout)["ready"] is True, done.stdout + done.stderr
        assert check(f"{base}/nope") == (False, '{"error": "no such endpoint /nope; try /livez, /readyz or /metrics"}')
        # its metrics on the same port: ready, and the backlog of its own durable
        metrics = urllib.request.urlopen(f"{base}/metrics", timeout=bound(5)).read().decode()
        assert 'loopwarden_service_ready{service_name="loopwarden-governor"} 1.0' in metrics
        assert re.search(r'^loopwarden_consumer_pending\{durable="governor_run_finished",.*\} 0\.0$', metrics, re.M)

        # 3. the server dies: still live (it reconnects), not ready, and the check fails
        server.kill()
        server.wait(timeout=bound(10))
        wait_until(lambda: not check(f"{base}/readyz")[0], bound(30), "still ready with NATS gone", log)
        assert json.loads(check(f"{base}/readyz")[1])["detail"] == "NATS connection lost; reconnecting"
        wait_until(
            lambda: (
                'loopwarden_service_ready{service_name="loopwarden-governor"} 0.0'
                in urllib.request.urlopen(f"{base}/metrics", timeout=bound(5)).read().decode()
            ),
            bound(10),
            "/metrics still says ready with NATS gone",
            log,
        )
        assert check(f"{base}/livez")[0]
        assert health_command(port).returncode == 1
    finally:
        proc.terminate()
        proc.wait(timeout=bound(30))


def test_a_taken_health_port_stops_the_service_naming_the_setting(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "LW_NATS_URL": f"nats://127.0.0.1:{free_port()}", "LW_HEALTH_PORT": str(port)}
        done = subprocess.run(
            [sys.executable, "-m", "services.judge"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=bound(60),
        )
    assert done.returncode != 0
    assert "invalid setting LW_HEALTH_PORT" in done.stderr and "Traceback" not in done.stderr, done.stderr
