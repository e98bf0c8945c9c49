"""A private nats-server running the generated ``deploy/nats/auth.conf``: one user per service,
client, console and operator, plus the admin. Tests act as each user and read what the server
refused, so "no one where they don't belong" is checked by the server itself."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nats

from loopwarden.generate.auth_conf import OUT
from loopwarden.infra import bootstrap
from loopwarden.stack import LocalStack, free_port, nats_server_binary, wait_for_port
from shared import subjects as S
from shared.permissions import TENANT_CLIENTS, grants
from shared.settings import Settings
from tests.support.timing import bound, polls

ROOT = Path(__file__).resolve().parents[2]

USERS = ("admin", *grants([]))  # every user auth.conf declares
PASSWORDS = {u: f"pw-{u}-{i}" for i, u in enumerate(USERS)}


def inbox_of(user: str) -> str:
    """``user``'s inbox prefix (a tenant-bound client's and an operator's are under their role)."""
    return S.inbox_prefix(user, TENANT_CLIENTS.get(user))


def password_env() -> dict[str, str]:
    return {f"LW_NATS_PASSWORD_{u.upper()}": pw for u, pw in PASSWORDS.items()}


@contextlib.contextmanager
def locked_server(tmp: Path, name: str = "locked", extra: str = "") -> Iterator[str]:
    """Start the server (its config checked with ``nats-server -t`` first); yields its URL. ``extra``: more
    server settings (e.g. ``max_payload: 524288``)."""
    port = free_port()
    conf = tmp / "server.conf"
    conf.write_text(
        f'listen: "127.0.0.1:{port}"\nserver_name: {name}\n{extra}\n'
        f'jetstream {{ store_dir: "{tmp / "js"}" }}\n' + OUT.read_text()
    )
    env = password_env()
    check = subprocess.run([nats_server_binary(), "-t", "-c", str(conf)], env=env, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr + check.stdout
    proc = subprocess.Popen(
        [nats_server_binary(), "-c", str(conf)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for_port(port)
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(bound(10))


@contextlib.contextmanager
def locked_stack(
    tmp: Path,
    name: str,
    services: tuple[str, ...],
    env: dict[str, str],
    env_per_service: dict[str, dict[str, str]] | None = None,
    extra: str = "",
    *,
    no_violations: bool = True,
) -> Iterator[tuple[str, LocalStack]]:
    """A locked server (``extra``: more server settings), bootstrapped as admin, running ``services`` each as
    its own NATS user with managed infrastructure (``env_per_service`` adds to a service's environment); yields
    the URL and the stack. With ``no_violations``, no service may have logged a permissions violation."""
    with locked_server(tmp, name, extra) as url:
        per_service = {s: {**creds(s), **(env_per_service or {}).get(s, {})} for s in services}
        stack = LocalStack(state_dir=tmp, nats_url=url, env=env, services=services, env_per_service=per_service)
        try:
            asyncio.run(bootstrap_as_admin(url))
            stack.start()
            yield url, stack
            if no_violations:
                logs = "".join(p.log.read_text(errors="replace") for p in stack.procs)
                assert "permissions violation" not in logs.lower(), logs[-3000:]
        finally:
            stack.stop()


def as_user(url: str, user: str, **overrides: object) -> Settings:
    return Settings(nats_url=url, nats_user=user, nats_password=PASSWORDS[user], **overrides)  # type: ignore[arg-type]


def creds(user: str) -> dict[str, str]:
    """A service's environment to connect as its own user, with managed infrastructure."""
    return {"LW_NATS_USER": user, "LW_NATS_PASSWORD": PASSWORDS[user], "LW_MANAGE_STREAMS": "false"}


async def bootstrap_as_admin(url: str) -> None:
    """Streams, buckets, the payload store and every durable: services may create none of them."""
    await bootstrap(as_user(url, "admin"))


async def publish_refusals(url: str, user: str, subject: str, payload: bytes = b"{}") -> list[str]:
    """Publish as ``user``; the permission errors the server sent back for ``subject``."""
    errors: list[str] = []

    async def on_error(err: Exception) -> None:
        errors.append(str(err))

    nc = await nats.connect(url, user=user, password=PASSWORDS[user], error_cb=on_error, inbox_prefix=inbox_of(user))
    try:
        await nc.publish(subject, payload)
        await nc.flush()
        for _ in range(polls(50)):
            if errors:
                break
            await asyncio.sleep(0.02)
    finally:
        await nc.close()
    return [e for e in errors if "permissions violation" in e.lower() and subject.lower() in e.lower()]


# --- a locked deployment, as production runs it: the session's (``tests/locked/conftest.py``: ``locked``) ------
# Every service and the console as its own user, bootstrapped by the admin, scripted runs off, the model a local
# Messages API (``loopwarden fake-model``); people act as their own users: the tenant-bound client ``client_acme``,
# the default tenant's ``client``, the operators ``alice`` (every kind) and ``bob`` (three), the admin. One place
# builds it: when ``loopwarden up --locked`` lands, ``locked_deployment`` starts that instead.
PRODUCTION = ("planner", "executor", "validator", "judge", "governor", "escalation", "console")
CONSOLE_PASSWORDS = {"alice": "alice-pw-1", "bob": "bob-pw-1", "carol": "carol-pw-1"}  # carol: not on the roster
CONSOLE_SECRET = "the-locked-consoles-secret"
TENANT_OF = {"client_acme": "acme"}  # the tenant-bound users the tests act as, and their tenants


@dataclass
class Deployment:
    url: str
    stack: LocalStack
    home: Path  # a folder of its own for what people write (exports, state)
    model_url: str

    @property
    def console(self) -> str:
        assert self.stack.console_url, "the deployment runs no console"
        return self.stack.console_url

    def env(self, user: str) -> dict[str, str]:
        """What a person exports to act as ``user`` (docs/locked.md): the server, the user and its password, and
        for a tenant-bound user its tenant."""
        env = {"LW_NATS_URL": self.url, "LW_NATS_USER": user, "LW_NATS_PASSWORD": PASSWORDS[user]}
        if user in TENANT_OF:
            env["LW_TENANT"] = TENANT_OF[user]
        return env

    def settings(self, user: str, **overrides: object) -> Settings:
        return as_user(self.url, user, tenant=TENANT_OF.get(user, "default"), **overrides)

    def cli(self, user: str, *args: str, timeout: float = 120.0, **env: str) -> subprocess.CompletedProcess[str]:
        """``loopwarden ARGS`` as ``user``, from the repository root, in a clean environment."""
        return run_cli(args, {**self.env(user), **env}, self.home, timeout)

    def logs(self) -> str:
        return "".join(p.log.read_text(errors="replace") for p in self.stack.procs)


def clean_env(home: Path) -> dict[str, str]:
    """This process's environment without what names a server, a user or a tenant; state under ``home``."""
    drop = ("NATS_URL", "LW_NATS_URL", "LW_NATS_USER", "LW_NATS_PASSWORD", "LW_TENANT", "ANTHROPIC_API_KEY")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("LW_NATS_PASSWORD_")}
    env["LW_STATE_DIR"] = str(home / "state")
    return env


def run_cli(args: tuple[str, ...], env: dict[str, str], home: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loopwarden.cli", *args],
        cwd=ROOT,
        env={**clean_env(home), **env},
        capture_output=True,
        text=True,
        timeout=bound(timeout),
    )


def console_users() -> str:
    import bcrypt

    return json.dumps({u: bcrypt.hashpw(p.encode(), bcrypt.gensalt(4)).decode() for u, p in CONSOLE_PASSWORDS.items()})


@contextlib.contextmanager
def locked_deployment(
    tmp: Path, env: dict[str, str], model_url: str, name: str = "locked", services: tuple[str, ...] = PRODUCTION
) -> Iterator[Deployment]:
    """The locked deployment (``env``: every service's environment; ``model_url``: the Messages API). Scripted
    runs are off, as in the deploy manifests; the admin bootstraps; no service may log a permissions violation."""
    from shared.permissions import operator_roster

    roster = operator_roster()
    service_env = {
        **env,
        "LW_ALLOW_SCRIPTED": "false",
        "ANTHROPIC_BASE_URL": model_url,
        "ANTHROPIC_API_KEY": "fake-key",
        "LW_OPERATORS": roster,
    }
    console = {"LW_CONSOLE_USERS": console_users(), "LW_CONSOLE_SECRET": CONSOLE_SECRET, "LW_CONSOLE_PORT": "0"}
    with locked_stack(tmp, name, services, service_env, {"console": console}) as (url, stack):
        yield Deployment(url, stack, tmp, model_url)


@dataclass(frozen=True)
class OwnLocked:
    """A module's own locked stack, for the modules of ``tests/locked/`` the session's deployment does not fit (fewer
    services, short leases, small bounds): the module says ``LOCKED = OwnLocked(...)`` and its ``locked`` fixture
    (``tests/locked/conftest.py``) is this stack, started once for the module. The arguments are ``locked_stack``'s;
    ``model``: the fixture whose Messages API the services' ``ANTHROPIC_BASE_URL`` names."""

    name: str
    services: tuple[str, ...]
    env: dict[str, str]
    env_per_service: dict[str, dict[str, str]] | None = None
    extra: str = ""
    no_violations: bool = True
    model: str | None = None

    @contextlib.contextmanager
    def deployment(self, tmp: Path, model_url: str = "") -> Iterator[Deployment]:
        env = {**self.env, "ANTHROPIC_BASE_URL": model_url} if model_url else self.env
        with locked_stack(
            tmp, self.name, self.services, env, self.env_per_service, self.extra, no_violations=self.no_violations
        ) as (url, stack):
            yield Deployment(url, stack, tmp, model_url)
