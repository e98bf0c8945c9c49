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
    proc = subprocess.run(
        [sys.executable, "-m", "loopwarden.cli", "demo"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )
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
    proc = subprocess.run(
        [sys.executable, "-m", "loopwarden.cli", "check-scenario", str(bad)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "planner[0].tool_calls[0].name: Field required" in proc.stderr
    assert "planner[1]: Value error, a turn needs text, tool_calls or error" in proc.stderr


def test_ctrl_c_during_start_up_stops_everything(tmp_path) -> None:
    """A terminal's Ctrl-C reaches the whole process group: the CLI, nats-server and every service."""
    import os
    import signal
    import time

    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "LW_NATS_URL", "ANTHROPIC_API_KEY")}
    env["LW_STATE_DIR"] = str(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "loopwarden.cli", "demo"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    time.sleep(2.0)  # nats-server is up, the services are starting
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130, out
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        alive = [e.parent.name for e in Path("/proc").glob("[0-9]*/environ") if _inherits(e, tmp_path)]
        if not alive:
            break
        time.sleep(0.2)
    assert not alive, f"still running after Ctrl-C: {alive}"


def _inherits(environ: Path, tmp_path: Path) -> bool:
    try:
        return f"LW_STATE_DIR={tmp_path}".encode() in environ.read_bytes().split(b"\0")
    except OSError:
        return False


def test_up_submit_status_events_down(tmp_path) -> None:
    import json
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "LW_NATS_URL", "ANTHROPIC_API_KEY")}
    env["LW_STATE_DIR"] = str(tmp_path)

    def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "loopwarden.cli", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert not check or done.returncode == 0, done.stdout + done.stderr
        return done

    try:
        assert "up: nats://127.0.0.1:" in cli("up").stdout
        assert cli("up", check=False).returncode == 1  # one stack at a time
        submitted = cli("submit", "--scenario", str(ROOT / "scenarios" / "demo.yaml"), "--wait").stdout
        run_id = submitted.splitlines()[0]
        assert run_id.startswith("run-") and "completed:" in submitted
        status = json.loads(cli("status", run_id).stdout)
        assert status["status"] == "completed" and status["first_draft_passed"] is True
        events = cli("events", run_id).stdout
        assert "▶ run started" in events and "■ completed" in events
        assert "search" in cli("metrics").stdout
        assert cli("escalations", "list").returncode == 0
    finally:
        down = cli("down")
    assert "stopped: " in down.stdout and "nats-server" in down.stdout
    assert not (tmp_path / "stack.json").exists()
    assert not [e for e in Path("/proc").glob("[0-9]*/environ") if _inherits(e, tmp_path)]


def test_bench_runs_in_short_form() -> None:
    """`make bench` measures speed; here it only has to run, and the engines must agree."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--only", "validation"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "engines disagree on            0 of 302" in proc.stdout
