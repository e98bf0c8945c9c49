"""Who acted is what the NATS server enforced, never what the caller wrote.

A private nats-server runs the generated deploy/nats/auth.conf; the escalation service runs as its
own user with the operator roster of shared/permissions.py. Operators connect as themselves: the
server lets each publish only its own ``<verb>.<operator>`` subjects (a forged one is a permissions
violation), the service refuses operators outside their kinds and records the refusal, and the
console's user acts only as ``<verb>.console.<operator>``, recorded with both names.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest

from loopwarden.client import Client
from loopwarden.infra import bootstrap
from loopwarden.stack import LocalStack, free_port, nats_server_binary, wait_for_port
from shared import subjects as S
from shared.bus import Bus, ensure_buckets, ensure_streams
from shared.messages import EscalationClaim, EscalationRaise, EscalationResolve
from shared.permissions import OUT, grants, operator_roster
from shared.settings import Settings
from tests.conftest import TEST_ENV

USERS = ("admin", *grants())  # every user auth.conf declares
PASSWORDS = {u: f"pw-{u}-{i}" for i, u in enumerate(USERS)}


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("identity")
    port = free_port()
    conf = tmp / "server.conf"
    conf.write_text(
        f'listen: "127.0.0.1:{port}"\nserver_name: identity\n'
        f'jetstream {{ store_dir: "{tmp / "js"}" }}\n' + OUT.read_text()
    )
    env = {f"LW_NATS_PASSWORD_{u.upper()}": pw for u, pw in PASSWORDS.items()}
    proc = subprocess.Popen(
        [nats_server_binary(), "-c", str(conf)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    wait_for_port(port)
    url = f"nats://127.0.0.1:{port}"
    stack = LocalStack(
        state_dir=tmp,
        nats_url=url,
        env=TEST_ENV,
        services=("escalation",),
        env_per_service={
            "escalation": {
                "LW_NATS_USER": "escalation",
                "LW_NATS_PASSWORD": PASSWORDS["escalation"],
                "LW_MANAGE_STREAMS": "false",
                "LW_OPERATORS": operator_roster(),
            }
        },
    )
    try:
        asyncio.run(_bootstrap(url))
        stack.start()
        yield url
        logs = "".join(p.log.read_text(errors="replace") for p in stack.procs)
        assert "permissions violation" not in logs.lower(), logs[-3000:]
    finally:
        stack.stop()
        proc.terminate()
        proc.wait(10)


async def _bootstrap(url: str) -> None:
    admin = Settings(nats_url=url, nats_user="admin", nats_password=PASSWORDS["admin"])
    bus = Bus(admin, "admin")
    await bus.broker.connect()
    await ensure_streams(bus.js, admin)
    await ensure_buckets(bus.js, admin)
    await bus.broker.stop()
    await bootstrap(admin)  # the durables too: a managed service waits for them and creates none


def as_user(url: str, user: str) -> Settings:
    return Settings(nats_url=url, nats_user=user, nats_password=PASSWORDS[user], manage_streams=False, rpc_timeout_s=2)


@pytest.fixture
async def admin(locked: str) -> AsyncIterator[Client]:
    async with Client(as_user(locked, "admin"), identity="admin") as c:
        yield c


async def queued(admin: Client, kind: str) -> str:
    """Raise an item the way the planner does, and wait until the queue lists it."""
    esc_id = f"esc-id-{kind}-{free_port()}"
    raise_ = EscalationRaise(escalation_id=esc_id, run_id=f"run-{esc_id}", kind=kind, reason="needs a person")  # type: ignore[arg-type]
    await admin.bus.publish(S.ESCALATION_RAISE, raise_, msg_id=f"raise.{esc_id}")
    for _ in range(100):
        if (await admin.show(esc_id)).ok:
            return esc_id
        await asyncio.sleep(0.05)
    raise AssertionError(f"{esc_id} was never queued")


async def refused_by_server(url: str, user: str, subject: str, payload: bytes) -> list[str]:
    errors: list[str] = []

    async def on_error(err: Exception) -> None:
        errors.append(str(err))

    nc = await nats.connect(url, user=user, password=PASSWORDS[user], error_cb=on_error, inbox_prefix=f"_INBOX_{user}")
    try:
        with pytest.raises(Exception):  # noqa: B017 - no reply ever comes: the server dropped the request
            await nc.request(subject, payload, timeout=1)
        for _ in range(50):
            if errors:
                break
            await asyncio.sleep(0.02)
    finally:
        await nc.close()
    return errors


async def test_an_operator_acts_only_as_themselves(locked: str, admin: Client) -> None:
    esc_id = await queued(admin, "fatal")
    forged = EscalationResolve(escalation_id=esc_id, who="alice", action="abort").model_dump_json().encode()
    # bob may not publish on alice's subject, whatever the payload says: the server drops it
    errors = await refused_by_server(locked, "bob", S.escalation_rpc("resolve", "alice"), forged)
    assert any("permissions violation" in e.lower() for e in errors), errors
    # neither may the plain client user, nor the console outside its console.<operator> subjects
    claim = EscalationClaim(escalation_id=esc_id).model_dump_json().encode()
    for user, subject in (
        ("client", S.escalation_rpc("claim", "alice")),
        ("console", S.escalation_rpc("claim", "alice")),
    ):
        errors = await refused_by_server(locked, user, subject, claim)
        assert any("permissions violation" in e.lower() for e in errors), (user, errors)
    assert (await admin.show(esc_id)).escalations[0].status == "open"
    # alice, as herself
    async with Client(as_user(locked, "alice"), identity="alice") as alice:
        claimed = await alice.claim(esc_id, "alice")
        assert claimed.ok, claimed.error
        assert claimed.escalations[0].claimed_by == "alice" and claimed.escalations[0].claimed_via is None
        done = await alice.resolve(esc_id, "alice", "abort", "not ours to fix")
        assert done.ok, done.error
        resolution = done.escalations[0].resolution
        assert resolution is not None and (resolution.resolved_by, resolution.via) == ("alice", None)


async def test_an_operator_outside_their_kinds_is_refused_and_recorded(locked: str, admin: Client) -> None:
    fatal, unjudged = await queued(admin, "fatal"), await queued(admin, "not_judged")
    async with Client(as_user(locked, "bob"), identity="bob") as bob:
        reply = await bob.claim(fatal, "bob")
        assert not reply.ok and "refused: bob may not act on fatal escalations" in (reply.error or ""), reply.error
        reply = await bob.resolve(fatal, "bob", "abort")
        assert not reply.ok and "refused" in (reply.error or "")
        assert (await bob.claim(unjudged, "bob")).ok
    item = (await admin.show(fatal)).escalations[0]
    assert item.status == "open"
    assert [(e.kind, e.operator, e.action) for e in item.trail] == [
        ("refused", "bob", "claim"),
        ("refused", "bob", "resolve"),
    ]
    refusals = await admin.events(f"run-{fatal}", subjects=S.ESCALATION_REFUSED, timeout=0.5)
    assert [(e.payload["operator"], e.payload["action"]) for e in refusals] == [("bob", "claim"), ("bob", "resolve")]


async def test_the_console_acts_for_an_operator_and_both_are_recorded(locked: str, admin: Client) -> None:
    esc_id = await queued(admin, "fatal")
    async with Client(as_user(locked, "console"), identity="console") as console:
        # the console may not act for bob on a kind bob may not touch: the roster still applies
        assert not (await console.claim(esc_id, "bob", via="console")).ok
        claimed = await console.claim(esc_id, "alice", via="console")
        assert claimed.ok, claimed.error
        assert (claimed.escalations[0].claimed_by, claimed.escalations[0].claimed_via) == ("alice", "console")
        done = await console.resolve(esc_id, "alice", "final_answer", result="handled by hand", via="console")
        assert done.ok, done.error
    resolution = (await admin.show(esc_id)).escalations[0].resolution
    assert resolution is not None and (resolution.resolved_by, resolution.via) == ("alice", "console")
    resolved = await admin.events(f"run-{esc_id}", subjects=S.ESCALATION_RESOLVED, timeout=0.5)
    assert [(e.payload["resolved_by"], e.payload["via"]) for e in resolved] == [("alice", "console")]


def test_the_deployments_give_the_queue_the_same_roster_as_the_users() -> None:
    import yaml

    root = Path(__file__).resolve().parents[1]
    compose = yaml.safe_load((root / "docker-compose.yml").read_text())["services"]
    assert compose["escalation"]["environment"]["LW_OPERATORS"] == operator_roster()
    manifests = list(yaml.safe_load_all((root / "deploy" / "k8s" / "loopwarden.yaml").read_text()))
    config = next(m for m in manifests if m["kind"] == "ConfigMap")
    assert config["data"]["LW_OPERATORS"] == operator_roster()
    assert compose["console"]["environment"]["LW_NATS_USER"] == "console"
