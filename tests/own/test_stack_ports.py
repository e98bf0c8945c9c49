"""The local stack's ports: a health port handed to a service and taken before it could bind (another stack
starting at the same moment took the same free port) starts that service again on another port, instead of
failing the whole stack."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from loopwarden import stack as stack_module
from loopwarden.stack import LocalStack
from tests.support.stacks import TEST_ENV


def test_a_health_port_taken_before_the_service_bound_it_is_retried_on_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = LocalStack(state_dir=tmp_path, env=TEST_ENV, services=()).start()  # the server only
    taken = socket.socket()
    try:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        handed = iter([busy])
        real = stack_module.free_port
        monkeypatch.setattr(stack_module, "free_port", lambda: next(handed, None) or real())
        proc = stack.start_service("validator")
        stack.wait_ready([proc])
        [running] = [p for p in stack.procs if p.service == "validator" and p.popen.poll() is None]
        assert running.health_port not in (None, busy), running.health_port
        assert b"address already in use" in (tmp_path / "logs" / "validator.log").read_bytes()
    finally:
        taken.close()
        stack.stop()
