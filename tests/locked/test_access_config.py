"""Tenants and operators are configuration, on the production mode a developer starts with one command.

``loopwarden up --locked`` (a real nats-server with the generated auth.conf, bootstrap as admin, every service
as its own NATS user) under its supervisor; then, on that running stack, the admin's tasks as the docs give them:
adding a tenant and an operator with ``loopwarden config apply`` (a reload of nats-server: no process restarts,
no code or service grant changes), rotating a password, removing an operator - each judged by effect: who can
connect, submit, read, claim, log in to the console. And a killed service is started again by the supervisor.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bcrypt
import nats
import pytest
import yaml

from loopwarden.client import Client
from loopwarden.stack import alive, free_port
from shared.scenario import Scenario, load_scenario
from shared.settings import Settings
from tests.support.paths import ROOT
from tests.support.stacks import TEST_ENV
from tests.support.timing import bound, eventually_sync

pytestmark = pytest.mark.timeout(bound(600))
REFRESH_S = 0.5  # LW_CONFIG_REFRESH_S of the stack's services: an apply is seen this fast


def _hash(password: str) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()


@dataclass
class Up:
    state: Path
    env: dict[str, str]

    def cli(
        self, *args: str, check: bool = True, stdin: str | None = None, **extra: str
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "loopwarden.cli", *args],
            env={**self.env, **extra},
            capture_output=True,
            text=True,
            timeout=bound(180),
            cwd=ROOT,
        )
        assert "Traceback" not in done.stderr, done.stderr
        assert not check or done.returncode == 0, done.stdout + done.stderr
        return done

    @property
    def record(self) -> dict[str, Any]:
        return dict(json.loads((self.state / "stack.json").read_text()))

    @property
    def root(self) -> Path:
        return Path(self.record["locked"]["root"])

    @property
    def supervised(self) -> dict[str, int]:
        return dict(json.loads((self.state / "stack" / "supervised.json").read_text())["pids"])

    def user_env(self, user: str) -> dict[str, str]:
        found = {}
        for line in (self.root / "users" / f"{user}.env").read_text().splitlines():
            key, _, value = line.partition("=")
            found[key] = value
        return found

    def settings(self, user: str, password: str | None = None, tenant: str | None = None) -> Settings:
        env = self.user_env(user) if password is None else {}
        return Settings(  # type: ignore[call-arg]
            nats_url=self.record["nats_url"],
            nats_user=user,
            nats_password=password or env["LW_NATS_PASSWORD"],
            tenant=tenant or env.get("LW_TENANT", "default"),
            manage_streams=False,
        )

    def console(self) -> str:
        log = (self.state / "stack" / "logs" / "console.log").read_text()
        from loopwarden.console.local import url_from_log

        url = url_from_log(log)
        assert url, log[-2000:]
        return url

    def access(self) -> dict[str, Any]:
        return dict(yaml.safe_load((self.root / "access.yaml").read_text()))

    def apply(self, data: dict[str, Any], tmp: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
        path = tmp / f"access-{time.monotonic_ns()}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return self.cli("config", "apply", str(path), check=check)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    state = tmp_path_factory.mktemp("locked-up")
    drop = ("NATS_URL", "LW_NATS_URL", "LW_NATS_USER", "LW_NATS_PASSWORD", "XDG_STATE_HOME", "LW_TENANT")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env |= {**TEST_ENV, "LW_STATE_DIR": str(state), "LW_CONFIG_REFRESH_S": str(REFRESH_S)}
    env |= {"LW_ALLOW_SCRIPTED": "true", "LW_PLANNER_PROVIDER": "scripted", "LW_JUDGE_PROVIDER": "scripted"}
    stack = Up(state, env)
    started = stack.cli("up", "--locked", "--port", str(free_port()))
    record = stack.record
    try:
        assert "as tenant acme's client client_acme" in started.stdout and "scripted runs: allowed" in started.stdout
        yield stack
    finally:
        down = stack.cli("down", check=False)
        every = {**record["pids"], **stack_children(state)}
        assert down.returncode == 0, down.stdout + down.stderr
        assert not [name for name, pid in every.items() if alive(pid)], every  # nothing left behind
    logs = "".join(p.read_text(errors="replace") for p in (state / "stack" / "logs").glob("*.log"))
    assert "permissions violation" not in logs.lower(), logs[-3000:]


def stack_children(state: Path) -> dict[str, int]:
    with contextlib.suppress(OSError, ValueError):
        return dict(json.loads((state / "stack" / "supervised.json").read_text())["pids"])
    return {}


async def _run(cfg: Settings, scenario: Scenario) -> tuple[str, str]:
    async with Client(cfg, identity=cfg.nats_user or "client") as client:
        run_id = await client.submit_scenario(scenario)
        state = await client.wait(run_id, timeout=bound(60))
        return run_id, state.status


async def _state(cfg: Settings, run_id: str) -> Any:
    async with Client(cfg, identity=cfg.nats_user or "client") as client:
        return await client.state(run_id)


async def _connects(cfg: Settings) -> str:
    """'ok', or why the server refused the connection."""
    password = cfg.nats_password.get_secret_value() if cfg.nats_password else None
    try:
        nc = await nats.connect(
            cfg.nats_url, user=cfg.nats_user, password=password, allow_reconnect=False, connect_timeout=bound(3)
        )
    except Exception as err:
        return str(err)
    await nc.close()
    return "ok"


def _console_login(url: str, operator: str, password: str) -> int:
    body = urllib.parse.urlencode({"operator": operator, "password": password, "next": "/queue"}).encode()
    request = urllib.request.Request(f"{url}/login", data=body, headers={"Origin": url}, method="POST")

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    try:
        with urllib.request.build_opener(NoRedirect).open(request, timeout=bound(10)) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


def _service_pids(up: Up) -> dict[str, int]:
    return {k: v for k, v in up.supervised.items() if k != "retention"}


# --- the production mode on one machine -----------------------------------------------------------------------------
def test_up_locked_runs_each_service_as_its_own_user_and_says_how_to_connect(up: Up) -> None:
    for service, pid in _service_pids(up).items():
        environ = dict(
            line.split("=", 1) for line in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in line
        )
        assert environ["LW_NATS_USER"] == service and environ["LW_MANAGE_STREAMS"] == "false", service
    anonymous = Settings(nats_url=up.record["nats_url"])  # type: ignore[call-arg]
    assert "Authorization Violation" in asyncio.run(_connects(anonymous))  # auth.conf is what the server runs
    # a tenant's client, from the file `up` wrote for it: runs and reads its own run
    acme = up.settings("client_acme")
    assert acme.tenant == "acme"
    run_id, status = asyncio.run(_run(acme, load_scenario(ROOT / "scenarios" / "demo.yaml")))
    assert status == "completed" and asyncio.run(_state(acme, run_id)).tenant == "acme"
    # an operator works the queue from the CLI as itself
    alice = up.user_env("alice")
    assert up.cli("escalations", "list", **alice).returncode == 0
    shown = up.cli("config", "show")  # as the stack's admin
    assert "tenant acme: users client_acme" in shown.stdout and "operator bob" in shown.stdout


# --- the admin's tasks ------------------------------------------------------------------------------------------
def test_adding_a_tenant_and_an_operator_is_a_reload_and_each_tenant_reads_its_own(up: Up, tmp_path: Path) -> None:
    nats_pid, services = up.record["locked"]["nats_pid"], _service_pids(up)
    access = up.access()
    access["tenants"]["globex"] = {
        "users": {"globex_web": {"password_hash": _hash("globex-1")}},
        "policy": {"weight": 2},
    }
    access["operators"]["carol"] = {
        "kinds": ["fatal"],
        "password_hash": _hash("carol-nats-1"),
        "console_password_hash": _hash("carol-console-1"),
    }
    applied = up.apply(access, tmp_path)
    assert f"reloaded nats-server (pid {nats_pid})" in applied.stdout and "stored in lw_config" in applied.stdout
    # a reload: the same server process and the same service processes, the server's log says so
    assert up.record["locked"]["nats_pid"] == nats_pid and alive(nats_pid) and _service_pids(up) == services
    assert "Reloaded server configuration" in (up.state / "stack" / "logs" / "nats-server.log").read_text()

    globex, acme = up.settings("globex_web", "globex-1", "globex"), up.settings("client_acme")
    scenario = load_scenario(ROOT / "scenarios" / "demo.yaml")
    globex_run, status = asyncio.run(_run(globex, scenario))
    assert status == "completed" and asyncio.run(_state(globex, globex_run)).tenant == "globex"
    acme_run, _ = asyncio.run(_run(acme, scenario))
    assert asyncio.run(_state(acme, globex_run)) is None  # another tenant's run reads as a missing one
    assert asyncio.run(_state(globex, acme_run)) is None
    assert asyncio.run(_state(globex, globex_run)) is not None

    # the operator: on the roster with her kinds, and a console login (both read live, no restart)
    waiting = up.cli("submit", "--scenario", _escalating(tmp_path), "--wait", check=False, **up.user_env("client"))
    assert waiting.returncode == 5, waiting.stdout + waiting.stderr
    item = waiting.stdout.split("awaiting_human: escalation ", 1)[1].split()[0].rstrip(".;,")
    carol = {**up.user_env("client"), "LW_NATS_USER": "carol", "LW_NATS_PASSWORD": "carol-nats-1"}
    refused = up.cli("escalations", "claim", item, check=False, **carol)  # schema_cap: not one of her kinds
    assert refused.returncode == 1 and "refused" in refused.stderr, refused.stdout + refused.stderr
    access["operators"]["carol"]["kinds"] = ["fatal", "schema_cap"]
    up.apply(access, tmp_path)
    eventually_sync(
        lambda: up.cli("escalations", "claim", item, check=False, **carol).returncode == 0,
        what="carol's claim once her kinds were applied",
        within=bound(15),
        every=0.5,
    )
    assert _console_login(up.console(), "carol", "carol-console-1") == 303
    assert _console_login(up.console(), "carol", "wrong") != 303


def test_rotating_a_password_is_a_reload(up: Up, tmp_path: Path) -> None:
    access = up.access()
    access["tenants"].setdefault("globex", {"users": {}})["users"]["globex_web"] = {"password_hash": _hash("globex-2")}
    access["operators"]["carol"] = {"kinds": ["fatal"], "console_password_hash": _hash("carol-console-2")}
    access["operators"]["carol"]["password_hash"] = _hash("carol-nats-2")
    services = _service_pids(up)
    up.apply(access, tmp_path)
    assert _service_pids(up) == services
    assert "Authorization Violation" in asyncio.run(_connects(up.settings("globex_web", "globex-1", "globex")))
    assert asyncio.run(_connects(up.settings("globex_web", "globex-2", "globex"))) == "ok"
    assert "Authorization Violation" in asyncio.run(_connects(up.settings("carol", "carol-nats-1")))
    assert asyncio.run(_connects(up.settings("carol", "carol-nats-2"))) == "ok"
    eventually_sync(
        lambda: _console_login(up.console(), "carol", "carol-console-2") == 303, what="the new login", within=bound(15)
    )
    assert _console_login(up.console(), "carol", "carol-console-1") != 303


def test_removing_an_operator_ends_her_access(up: Up, tmp_path: Path) -> None:
    access = up.access()
    access["operators"]["carol"] = {"kinds": ["fatal"], "console_password_hash": _hash("carol-console-3")}
    access["operators"]["carol"]["password_hash"] = _hash("carol-nats-3")
    up.apply(access, tmp_path)
    assert asyncio.run(_connects(up.settings("carol", "carol-nats-3"))) == "ok"
    del access["operators"]["carol"]
    up.apply(access, tmp_path)
    assert "Authorization Violation" in asyncio.run(_connects(up.settings("carol", "carol-nats-3")))
    eventually_sync(
        lambda: _console_login(up.console(), "carol", "carol-console-3") != 303, what="no login", within=bound(15)
    )


def test_a_user_a_reload_cannot_give_a_password_is_refused_before_anything_changes(up: Up, tmp_path: Path) -> None:
    access = up.access()
    before = (up.root / "nats" / "auth.conf").read_text()
    access["operators"]["dave"] = {"kinds": ["*"]}  # no hash, and the running server has no LW_NATS_PASSWORD_DAVE
    refused = up.apply(access, tmp_path, check=False)
    assert refused.returncode == 2 and "dave: no password_hash" in refused.stderr, refused.stderr
    assert (up.root / "nats" / "auth.conf").read_text() == before
    bad = tmp_path / "bad.yaml"
    bad.write_text("operators: {console: {}}\n")
    said = up.cli("config", "apply", str(bad), check=False)
    assert said.returncode == 2 and "'console' is a built-in or reserved name" in said.stderr


# --- supervision ------------------------------------------------------------------------------------------------
def test_a_killed_service_is_started_again_by_the_supervisor(up: Up) -> None:
    before = up.supervised["escalation"]
    os.kill(before, signal.SIGKILL)
    eventually_sync(lambda: up.supervised.get("escalation", before) != before, what="a new process", within=bound(30))
    after = up.supervised["escalation"]
    log = up.state / "stack" / "logs"
    eventually_sync(
        lambda: (log / "escalation.log").read_text().count("loopwarden-escalation ready") >= 2,
        what="the escalation service ready again",
        within=bound(60),
    )
    said = (log / "supervisor.log").read_text()
    assert "escalation exited with code -9; starting it again in 1s" in said
    assert f"started escalation again (pid {after})" in said
    alice = up.user_env("alice")
    assert up.cli("escalations", "list", check=False, **alice).returncode == 0


def _escalating(tmp: Path) -> str:
    """correction-escalates.yaml without its expect block: the run waits for a person (a schema_cap item)."""
    text = (ROOT / "scenarios" / "correction-escalates.yaml").read_text()
    path = tmp / "escalates.yaml"
    path.write_text("\n".join(line for line in text.splitlines() if not line.startswith("expect:")))
    return str(path)
