"""`make run` is `loopwarden demo`: it must start everything, finish the demo and stop everything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def test_demo_command_runs_the_demo_and_stops_everything(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "LW_NATS_URL", "ANTHROPIC_API_KEY")}
    env["LW_STATE_DIR"] = str(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "loopwarden.cli", "demo"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "run id: run-" in out
    assert "status:       completed" in out
    assert "120 seconds" in out.split("final answer:")[1]
    assert "stopped nats-server and the services." in out
    for marker in ("↻ search attempt 1 failed", "✓ search validated (output repaired)", "⚖ verdict passed"):
        assert marker in out
    # nothing it started is left running: every child inherited LW_STATE_DIR=<tmp_path>
    assert (tmp_path / "demo" / "logs" / "nats-server.log").exists()
    marker = f"LW_STATE_DIR={tmp_path}".encode()
    leftovers = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker in environ.read_bytes().split(b"\0"):
                leftovers.append(environ.parent.name)
        except OSError:
            continue
    assert not leftovers, f"processes still running: {leftovers}"


def test_scenario_errors_name_the_field(tmp_path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntask: t\nplanner:\n  - tool_calls: [{input: {}}]\n  - {}\n")
    proc = subprocess.run([sys.executable, "-m", "loopwarden.cli", "check-scenario", str(bad)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "planner[0].tool_calls[0].name: Field required" in proc.stderr
    assert "planner[1]: Value error, a turn needs text, tool_calls or error" in proc.stderr
