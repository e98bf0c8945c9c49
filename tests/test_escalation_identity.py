"""Who acted is what the NATS server enforced, never what the caller wrote.

A private nats-server runs the generated deploy/nats/auth.conf; the escalation service runs as its
own user with the operator roster of shared/permissions.py. Operators connect as themselves: the
server lets each publish only its own ``<verb>.<operator>`` subjects (a forged one is a permissions
violation), the service refuses operators outside their kinds and records the refusal, and the
console's user acts only as ``<verb>.console.<operator>``, recorded with both names.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from loopwarden.client import Client
from loopwarden.stack import LocalStack, free_port
from shared import subjects as S
from shared.messages import EscalationClaim, EscalationRaise, EscalationResolve
from shared.permissions import operator_roster
from shared.settings import Settings
from tests.conftest import TEST_ENV
from tests.support import locked as L


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("identity")
    with L.locked_server(tmp, "identity") as url:
        stack = LocalStack(
            state_dir=tmp,
            nats_url=url,
            env=TEST_ENV,
            services=("escalation",),
            env_per_service={"escalation": {**L.creds("escalation"), "LW_OPERATORS": operator_roster()}},
        )
        try:
            asyncio.run(L.bootstrap_as_admin(url))
            stack.start()
            yield url
            logs = "".join(p.log.read_text(errors="replace") for p in stack.procs)
            assert "permissions violation" not in logs.lower(), logs[-3000:]
        finally:
            stack.stop()


def as_user(url: str, user: str) -> Settings:
    return L.as_user(url, user, manage_streams=False, rpc_timeout_s=2)


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


async def test_an_operator_acts_only_as_themselves(locked: str, admin: Client) -> None:
    esc_id = await queued(admin, "fatal")
    forged = EscalationResolve(escalation_id=esc_id, who="alice", action="abort").model_dump_json().encode()
    # bob may not publish on alice's subject, whatever the payload says: the server drops it
    errors = await L.publish_refusals(locked, "bob", S.escalation_rpc("resolve", "alice"), forged)
    assert any("permissions violation" in e.lower() for e in errors), errors
    # neither may the plain client user, nor the console outside its console.<operator> subjects
    claim = EscalationClaim(escalation_id=esc_id).model_dump_json().encode()
    for user, subject in (
        ("client", S.escalation_rpc("claim", "alice")),
        ("console", S.escalation_rpc("claim", "alice")),
    ):
        errors = await L.publish_refusals(locked, user, subject, claim)
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
