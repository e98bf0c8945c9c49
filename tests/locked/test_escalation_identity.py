"""Who acted is what the NATS server enforced, never what the caller wrote.

A private nats-server runs the generated deploy/nats/auth.conf; the escalation service runs as its
own user with the operator roster of shared/permissions.py. Operators connect as themselves: the
server lets each publish only its own ``<verb>.<operator>`` subjects (a forged one is a permissions
violation), the service refuses operators outside their kinds and records the refusal, and the
console's user acts only as ``<verb>.console.<operator>``, recorded with both names.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from loopwarden.client import Client
from loopwarden.generate.auth_conf import OUT
from loopwarden.stack import LocalStack, free_port, nats_server_binary, wait_for_port
from shared import subjects as S
from shared.messages import EscalationClaim, EscalationRaise, EscalationResolve
from shared.permissions import operator_roster
from shared.settings import Settings
from tests.support import locked as L
from tests.support.paths import ROOT
from tests.support.stacks import TEST_ENV
from tests.support.timing import bound

LEASE_S = 2.0


# the module's ``locked``: the escalation service alone, with short leases, so a lease lost is seen in a test
# (claim -> resolve is one round trip)
LOCKED = L.OwnLocked(
    "identity",
    ("escalation",),
    TEST_ENV,
    {
        "escalation": {
            "LW_OPERATORS": operator_roster(),
            "LW_ESCALATION_LEASE_S": str(LEASE_S),
            "LW_ESCALATION_SWEEP_S": "0.3",
        }
    },
)


def as_user(url: str, user: str) -> Settings:
    return L.as_user(url, user, manage_streams=False, rpc_timeout_s=2)


@pytest.fixture
async def admin(locked: L.Deployment) -> AsyncIterator[Client]:
    async with Client(as_user(locked.url, "admin"), identity="admin") as c:
        yield c


async def queued(admin: Client, kind: str) -> str:
    """Raise an item the way the planner does, and wait until the queue lists it."""
    esc_id = f"esc-id-{kind}-{free_port()}"
    raise_ = EscalationRaise(escalation_id=esc_id, run_id=f"run-{esc_id}", kind=kind, reason="needs a person")  # type: ignore[arg-type]
    await admin.bus.publish(S.ESCALATION_RAISE, raise_, msg_id=f"raise.{esc_id}")
    for _ in range(int(bound(100))):
        if (await admin.show(esc_id)).ok:
            return esc_id
        await asyncio.sleep(0.05)
    raise AssertionError(f"{esc_id} was never queued")


async def test_an_operator_acts_only_as_themselves(locked: L.Deployment, admin: Client) -> None:
    esc_id = await queued(admin, "fatal")
    forged = EscalationResolve(escalation_id=esc_id, who="alice", action="abort").model_dump_json().encode()
    # bob may not publish on alice's subject, whatever the payload says: the server drops it
    errors = await L.publish_refusals(locked.url, "bob", S.escalation_rpc("resolve", "alice"), forged)
    assert any("permissions violation" in e.lower() for e in errors), errors
    # neither may the plain client user, nor the console outside its console.<operator> subjects
    claim = EscalationClaim(escalation_id=esc_id).model_dump_json().encode()
    for user, subject in (
        ("client", S.escalation_rpc("claim", "alice")),
        ("console", S.escalation_rpc("claim", "alice")),
    ):
        errors = await L.publish_refusals(locked.url, user, subject, claim)
        assert any("permissions violation" in e.lower() for e in errors), (user, errors)
    assert (await admin.show(esc_id)).escalations[0].status == "open"
    # alice, as herself
    async with Client(as_user(locked.url, "alice"), identity="alice") as alice:
        claimed = await alice.claim(esc_id, "alice")
        assert claimed.ok, claimed.error
        assert claimed.escalations[0].claimed_by == "alice" and claimed.escalations[0].claimed_via is None
        done = await alice.resolve(esc_id, "alice", "abort", "not ours to fix")
        assert done.ok, done.error
        resolution = done.escalations[0].resolution
        assert resolution is not None and (resolution.resolved_by, resolution.via) == ("alice", None)


async def test_an_operator_outside_their_kinds_is_refused_and_recorded(locked: L.Deployment, admin: Client) -> None:
    fatal, unjudged = await queued(admin, "fatal"), await queued(admin, "not_judged")
    async with Client(as_user(locked.url, "bob"), identity="bob") as bob:
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
    refusals = await admin.events(f"run-{fatal}", subjects=S.ESCALATION_REFUSED, timeout=bound(0.5))
    assert [(e.payload["operator"], e.payload["action"]) for e in refusals] == [("bob", "claim"), ("bob", "resolve")]


async def test_the_console_acts_for_an_operator_and_both_are_recorded(locked: L.Deployment, admin: Client) -> None:
    esc_id = await queued(admin, "fatal")
    async with Client(as_user(locked.url, "console"), identity="console") as console:
        # the console may not act for bob on a kind bob may not touch: the roster still applies
        assert not (await console.claim(esc_id, "bob", via="console")).ok
        claimed = await console.claim(esc_id, "alice", via="console")
        assert claimed.ok, claimed.error
        assert (claimed.escalations[0].claimed_by, claimed.escalations[0].claimed_via) == ("alice", "console")
        done = await console.resolve(esc_id, "alice", "final_answer", result="handled by hand", via="console")
        assert done.ok, done.error
    resolution = (await admin.show(esc_id)).escalations[0].resolution
    assert resolution is not None and (resolution.resolved_by, resolution.via) == ("alice", "console")
    resolved = await admin.events(f"run-{esc_id}", subjects=S.ESCALATION_RESOLVED, timeout=bound(0.5))
    assert [(e.payload["resolved_by"], e.payload["via"]) for e in resolved] == [("alice", "console")]


async def test_a_queue_refusal_is_recorded_and_published_like_an_identity_refusal(
    locked: L.Deployment, admin: Client
) -> None:
    """Claimed by someone else, already resolved, lease lost: each leaves a trace in the item's trail and on
    evt.escalation.refused, as a refusal of identity does (a late or conflicting act was invisible)."""
    contested, lapsed = await queued(admin, "not_judged"), await queued(admin, "not_judged")  # both may act on these
    async with (
        Client(as_user(locked.url, "alice"), identity="alice") as alice,
        Client(as_user(locked.url, "bob"), identity="bob") as bob,
    ):
        assert (await alice.claim(contested, "alice")).ok
        reply = await bob.claim(contested, "bob")
        assert not reply.ok and f"{contested} is claimed by alice" in (reply.error or ""), reply.error
        reply = await bob.resolve(contested, "bob", "approve")
        assert not reply.ok and "only they can resolve it" in (reply.error or ""), reply.error
        assert (await alice.resolve(contested, "alice", "approve", "fine")).ok
        reply = await bob.resolve(contested, "bob", "reject", "too late")
        assert not reply.ok and "already resolved" in (reply.error or ""), reply.error

        assert (await alice.claim(lapsed, "alice")).ok
        for _ in range(int(bound(100))):  # the lease lapses and the sweeper hands the item back
            if (await admin.show(lapsed)).escalations[0].status == "open":
                break
            await asyncio.sleep(0.1)
        assert (await bob.claim(lapsed, "bob")).ok
        reply = await alice.renew(lapsed, "alice")
        assert not reply.ok and "not claimed by alice" in (reply.error or ""), reply.error

    item = (await admin.show(contested)).escalations[0]
    assert [(e.kind, e.operator, e.action) for e in item.trail] == [
        ("claimed", "alice", None),
        ("refused", "bob", "claim"),
        ("refused", "bob", "resolve"),
        ("resolved", "alice", "approve"),
        ("refused", "bob", "resolve"),
    ]
    assert "already resolved" in (item.trail[-1].reason or "")
    item = (await admin.show(lapsed)).escalations[0]
    assert [(e.kind, e.operator) for e in item.trail] == [
        ("claimed", "alice"),
        ("expired", "alice"),
        ("claimed", "bob"),
        ("refused", "alice"),
    ]
    assert item.status == "claimed" and item.claimed_by == "bob"  # the refusal changed nothing but the trail
    refused = await admin.events(f"run-{contested}", subjects=S.ESCALATION_REFUSED, timeout=bound(0.5))
    assert [(e.payload["operator"], e.payload["action"]) for e in refused] == [
        ("bob", "claim"),
        ("bob", "resolve"),
        ("bob", "resolve"),
    ]
    refused = await admin.events(f"run-{lapsed}", subjects=S.ESCALATION_REFUSED, timeout=bound(0.5))
    assert [(e.payload["operator"], e.payload["action"]) for e in refused] == [("alice", "renew")]


def cli(url: str, user: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "LW_NATS_URL", "LW_STATE_DIR")}
    creds = {"LW_NATS_USER": user, "LW_NATS_PASSWORD": L.PASSWORDS[user]} if user else {}
    return subprocess.run(
        [sys.executable, "-m", "loopwarden.cli", *args],
        cwd=ROOT,
        env={**base, "LW_NATS_URL": url, **creds, **env},
        capture_output=True,
        text=True,
        timeout=bound(120),
    )


async def test_a_verb_the_server_does_not_grant_is_refused_at_once_naming_the_permission(
    locked: L.Deployment, admin: Client
) -> None:
    """The server drops a publish outside the user's grant and tells only the sender: the CLI says so at
    once (exit 1, one line), not after the request times out as "NATS unreachable" (exit 3)."""
    esc_id = await queued(admin, "fatal")
    attempts = [
        ("client", ("resolve", esc_id, "--as", "alice", "--action", "abort"), "resolve.alice"),
        ("client", ("claim", esc_id), "claim.client"),  # acting as itself: the client has no verbs at all
        ("bob", ("resolve", esc_id, "--as", "alice", "--action", "abort"), "resolve.alice"),
        ("bob", ("renew", esc_id, "--as", "alice"), "renew.alice"),
    ]
    runs = [
        asyncio.to_thread(cli, locked.url, user, "escalations", *args, LW_RPC_TIMEOUT_S=f"{bound(30):g}")
        for user, args, _ in attempts
    ]
    started = time.monotonic()
    results = await asyncio.gather(*runs)
    assert time.monotonic() - started < bound(25), "a refused verb waited for the request's timeout"
    for (user, args, subject), done in zip(attempts, results, strict=True):
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1, (user, args, done.returncode, done.stderr)
        assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
        assert f"user {user} may not ask lw.v1.rpc.escalation.{subject}: permission denied" in lines[0], lines[0]
        assert "unreachable" not in lines[0] and "did not answer" not in lines[0]
    assert (await admin.show(esc_id)).escalations[0].status == "open"
    # the same command as the operator it names is answered as before
    done = await asyncio.to_thread(cli, locked.url, "alice", "escalations", "claim", esc_id)
    assert done.returncode == 0, done.stderr
    assert (await admin.show(esc_id)).escalations[0].claimed_by == "alice"


# --- D21: no password from a URL in what the CLI and the services print -------------------------------------


def test_the_cli_never_prints_the_password_in_a_nats_url(locked: L.Deployment) -> None:
    secret = L.PASSWORDS["client"]
    dead = f"nats://client:{secret}@127.0.0.1:{free_port()}"
    done = cli(dead, "", "status", "run-x")
    assert done.returncode == 3 and "cannot reach NATS at nats://127.0.0.1:" in done.stderr, done.stderr
    assert secret not in done.stdout + done.stderr and "client:" not in done.stderr
    wrong = locked.url.replace("nats://", "nats://client:not-the-password@")  # the server answers, refuses the login
    done = cli(wrong, "", "escalations", "list")
    assert done.returncode == 3 and "not-the-password" not in done.stdout + done.stderr, done.stderr


def test_a_service_that_reconnects_logs_no_password(tmp_path: Path) -> None:
    """Credentials in LW_NATS_URL (the NATS convention): the reconnect line names the server, not the password."""
    port = free_port()
    conf = tmp_path / "server.conf"
    conf.write_text(
        f'listen: "127.0.0.1:{port}"\nserver_name: reconnects\n'
        f'jetstream {{ store_dir: "{tmp_path / "js"}" }}\n' + OUT.read_text()
    )

    def server() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [nats_server_binary(), "-c", str(conf)],
            env=L.password_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(port)
        return proc

    nats = server()
    url = f"nats://127.0.0.1:{port}"
    secret = L.PASSWORDS["governor"]
    stack = LocalStack(
        state_dir=tmp_path,
        nats_url=url,
        env=TEST_ENV,
        services=("governor",),
        env_per_service={
            "governor": {"LW_NATS_URL": f"nats://governor:{secret}@127.0.0.1:{port}", "LW_MANAGE_STREAMS": "false"}
        },
    )
    try:
        asyncio.run(L.bootstrap_as_admin(url))
        stack.start()
        nats.terminate()
        nats.wait(bound(10))
        nats = server()
        log = stack.procs[0].log
        deadline = time.monotonic() + bound(60)
        while "reconnected to NATS" not in log.read_text(errors="replace"):
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.2)
        text = log.read_text(errors="replace")
        assert f"governor: reconnected to NATS 127.0.0.1:{port}" in text, text[-3000:]
        assert f"ready on nats://127.0.0.1:{port}" in text
        assert secret not in text, [line for line in text.splitlines() if secret in line]
    finally:
        stack.stop()
        nats.terminate()
        nats.wait(bound(10))


def test_the_deployments_give_the_queue_the_same_roster_as_the_users() -> None:
    import yaml

    root = Path(__file__).resolve().parents[2]
    compose = yaml.safe_load((root / "docker-compose.yml").read_text())["services"]
    assert compose["escalation"]["environment"]["LW_OPERATORS"] == operator_roster()
    manifests = list(yaml.safe_load_all((root / "deploy" / "k8s" / "loopwarden.yaml").read_text()))
    config = next(m for m in manifests if m["kind"] == "ConfigMap")
    assert config["data"]["LW_OPERATORS"] == operator_roster()
    assert compose["console"]["environment"]["LW_NATS_USER"] == "console"
