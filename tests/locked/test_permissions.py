"""No one where they don't belong: the generated NATS config, one user per service, a full run.

A private nats-server runs deploy/nats/auth.conf; an admin bootstraps streams and buckets;
each service connects as its own user with no stream-management rights; the demo completes.
Then services try to publish where they have no business and the server refuses.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
import yaml

from loopwarden.auth_conf import all_grants, auth_conf
from loopwarden.client import Client
from loopwarden.generate.auth_conf import OUT
from loopwarden.infra import bootstrap
from loopwarden.stack import PROCESSES, LocalStack, module_of, nats_server_binary
from shared.permissions import rights
from shared.scenario import parse_scenario
from shared.settings import Settings
from shared.subjects import STREAM_SUBJECTS as STREAMS
from tests.support.locked import PASSWORDS, USERS, creds, publish_refusals
from tests.support.locked import locked_server as start_locked_server
from tests.support.paths import ROOT
from tests.support.stacks import TEST_ENV
from tests.support.timing import bound


def test_auth_conf_is_generated_from_the_grants() -> None:
    assert OUT.read_text() == auth_conf(), "deploy/nats/auth.conf drifted: run `make schemas`"


def test_no_service_may_create_or_change_a_consumer() -> None:
    """Only the admin (bootstrap) creates durables: a service that could update its own consumer
    could widen its filter (the judge reading every command) or change its limits. (A client's attempt,
    end to end: ``tests/locked/test_trust_boundaries.py``.)"""
    for service, grant in all_grants().items():
        pub, _ = rights(service, grant)
        named = ("DURABLE.CREATE", *(f"CONSUMER.{verb}.{s}." for s in STREAMS for verb in ("CREATE", "DELETE")))
        changes = [p for p in pub if any(n in p for n in named)]
        assert changes == [], (service, changes)
        assert all(f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}" in pub for stream, durable in grant.consumers)


@pytest.fixture(scope="module")
def locked_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with start_locked_server(tmp_path_factory.mktemp("locked")) as url:
        yield url


async def test_every_service_as_its_own_user_completes_a_run(locked_server: str, tmp_path: Path) -> None:
    admin = Settings(nats_url=locked_server, nats_user="admin", nats_password=PASSWORDS["admin"])
    await bootstrap(admin)  # streams, buckets and every durable: services may create none of them

    stack = LocalStack(
        state_dir=tmp_path, nats_url=locked_server, env=TEST_ENV, env_per_service={s: creds(s) for s in PROCESSES}
    )
    stack.start()
    try:
        settings = Settings(
            nats_url=locked_server, nats_user="client", nats_password=PASSWORDS["client"], manage_streams=False
        )
        async with Client(settings) as client:
            demo = parse_scenario(yaml.safe_load((ROOT / "scenarios" / "demo.yaml").read_text()))
            run_id = await client.submit_scenario(demo)
            state = await client.wait(run_id, timeout=bound(60))
            assert state.status == "completed", state.final_reason
            assert "120 seconds" in (state.final_output or "")
            assert any(e.kind == "run.completed" for e in await client.events(run_id))
        logs = "".join(p.log.read_text(errors="replace") for p in stack.procs)
        assert "Permissions Violation" not in logs and "permissions violation" not in logs.lower()
    finally:
        stack.stop()


@pytest.mark.parametrize(
    ("user", "subject"),
    [
        ("judge", "lw.v1.cmd.tool.execute.charge_card"),  # the judge cannot run tools
        ("client", "lw.v1.evt.judge.verdict.run-x"),  # a client cannot forge a verdict
        ("validator", "lw.v1.evt.escalation.resolved.run-x"),  # nor resolve a human's escalation
        ("executor", "$KV.lw_runs.some-run"),  # nor rewrite a run's state
        ("planner", "lw.v1.cmd.run.submit.x"),
        ("client", "lw.v1.cmd.requeue.planner"),  # only operators (and the admin) hand dead letters back
        ("console", "lw.v1.cmd.requeue.planner"),
        ("planner", "lw.v1.dlq.executor"),  # the planner hands letters back, but writes only its own
        ("alice", "lw.v1.dlq.planner"),  # an operator hands letters back, but cannot write one a service would run
    ],
)
async def test_publishing_outside_a_grant_is_refused(locked_server: str, user: str, subject: str) -> None:
    assert await publish_refusals(locked_server, user, subject), (user, subject)


async def test_an_operator_reads_the_dead_letters_and_hands_one_back_as_themselves(locked_server: str) -> None:
    """`loopwarden dlq requeue` as an operator's own user: the letter is read from LW_DLQ and the requeue
    published to its service's subject (a publish outside the grant would get no PubAck, only a timeout)."""
    from loopwarden.client import Client as LoopwardenClient
    from shared import subjects as S
    from shared.messages import DeadLetter
    from tests.support.locked import as_user

    await bootstrap(as_user(locked_server, "admin"))
    async with LoopwardenClient(as_user(locked_server, "planner", manage_streams=False), identity="planner") as planner:
        letter = DeadLetter(
            service="planner",
            subject=S.RUN_ADVANCE,
            reason="test: given up",
            body="{}",
            requeue_to=S.requeue("planner"),
        )
        await planner.bus.publish(S.dead_letter("planner"), letter, msg_id="dlq-permissions-test")
    async with LoopwardenClient(as_user(locked_server, "alice", manage_streams=False), identity="alice") as alice:
        seq = next(n.seq for n in await alice.letters() if n.letter.reason == "test: given up")
        requeued = await alice.requeue(seq)
        assert (requeued.service, requeued.subject, requeued.duplicate) == ("planner", S.RUN_ADVANCE, False)
    # the planner, taking the requeue, reads the letter itself by its number (not what the requester sent)
    async with LoopwardenClient(as_user(locked_server, "planner", manage_streams=False), identity="planner") as planner:
        stored_on, read = await planner.bus.read_letter(seq)
        assert (stored_on, read.reason) == (S.dead_letter("planner"), "test: given up")


async def test_reading_another_services_inbox_is_refused(locked_server: str) -> None:
    errors: list[str] = []

    async def on_error(err: Exception) -> None:
        errors.append(str(err))

    nc = await nats.connect(
        locked_server, user="judge", password=PASSWORDS["judge"], error_cb=on_error, inbox_prefix="_INBOX_judge"
    )
    try:
        await nc.subscribe("_INBOX_planner.>")
        await nc.flush()
        await asyncio.sleep(0.2)
    finally:
        await nc.close()
    assert any("permissions violation" in e.lower() for e in errors), errors


def test_cluster_config_is_valid() -> None:
    env = {f"LW_NATS_PASSWORD_{u.upper()}": "x" for u in USERS}
    env |= {"LW_NATS_SYNC_INTERVAL": "120s"}  # docker-compose.yml's default
    env |= {"LW_NATS_ROUTE_PASSWORD": "r"} | {f"LW_NATS_ROUTE_{i}": f"nats://route:r@nats-{i}:6222" for i in (1, 2, 3)}
    check = subprocess.run(
        [nats_server_binary(), "-t", "-c", "cluster.conf", "--server_name", "nats-1"],
        cwd=OUT.parent,
        env=env,
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr + check.stdout


def test_compose_and_manifests_run_every_service_as_its_own_user() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    manifests = list(yaml.safe_load_all((ROOT / "deploy" / "k8s" / "loopwarden.yaml").read_text()))
    deployments = {m["metadata"]["name"]: m for m in manifests if m["kind"] == "Deployment"}
    for service in PROCESSES:
        spec = compose[service]
        assert spec["command"] == ["python", "-m", module_of(service)]
        assert spec["environment"]["LW_NATS_USER"] == service
        assert spec["deploy"]["replicas"] >= 2
        container = deployments[f"loopwarden-{service}"]["spec"]["template"]["spec"]["containers"][0]
        assert container["command"] == ["python", "-m", module_of(service)]
        assert {"name": "LW_NATS_USER", "value": service} in container["env"]
    passwords = {k for k in compose["nats-1"]["environment"] if k.startswith("LW_NATS_PASSWORD_")}
    assert passwords == {f"LW_NATS_PASSWORD_{u.upper()}" for u in USERS}
    assert {f"LW_NATS_ROUTE_{i}" for i in (1, 2, 3)} <= set(compose["nats-1"]["environment"])
