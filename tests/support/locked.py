"""A private nats-server running the generated ``deploy/nats/auth.conf``: one user per service,
client, console and operator, plus the admin. Tests act as each user and read what the server
refused, so "no one where they don't belong" is checked by the server itself."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import nats

from loopwarden.auth_conf import OUT
from loopwarden.infra import bootstrap
from loopwarden.stack import LocalStack, free_port, nats_server_binary, wait_for_port
from shared import subjects as S
from shared.permissions import TENANT_CLIENTS, grants
from shared.settings import Settings
from tests.support.timing import bound, polls

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
