"""Who may bind a scenario and move large bodies, enforced by the server (deploy/nats/auth.conf).

Only the planner writes ``lw_scenarios`` (create-only, from the submit message): a client that
tries to overwrite a run's stored scenario is refused by the server. Every service and the client
may store and read large bodies in the claim-check bucket.
"""

from __future__ import annotations

import asyncio
import os

import nats
import pytest

from shared.bus import Bus, ensure_buckets, ensure_streams
from shared.settings import Settings
from tests.test_permissions import PASSWORDS, locked_server  # noqa: F401  - the module's private locked server

USERS = ("planner", "executor", "validator", "judge", "governor", "escalation", "client")


async def refused(server: str, user: str, subject: str) -> list[str]:
    errors: list[str] = []

    async def on_error(err: Exception) -> None:
        errors.append(str(err))

    nc = await nats.connect(
        server, user=user, password=PASSWORDS[user], error_cb=on_error, inbox_prefix=f"_INBOX_{user}"
    )
    try:
        await nc.publish(subject, b'{"name":"forged","task":"x","tools":{}}')
        await nc.flush()
        for _ in range(50):
            if errors:
                break
            await asyncio.sleep(0.02)
    finally:
        await nc.close()
    return [e for e in errors if "permissions violation" in e.lower() and subject.lower() in e.lower()]


@pytest.fixture(scope="module")
async def bootstrapped(locked_server: str) -> str:  # noqa: F811
    admin = Settings(nats_url=locked_server, nats_user="admin", nats_password=PASSWORDS["admin"])
    bus = Bus(admin, "admin")
    await bus.broker.connect()
    await ensure_streams(bus.js, admin)
    await ensure_buckets(bus.js, admin)  # with the claim-check object store
    await bus.broker.stop()
    return locked_server


@pytest.mark.parametrize("user", ["client", "executor", "judge", "validator"])
async def test_overwriting_a_runs_scenario_is_refused_by_the_server(bootstrapped: str, user: str) -> None:
    assert await refused(bootstrapped, user, "$KV.lw_scenarios.run-someone-elses")


async def test_the_planner_may_bind_a_scenario(bootstrapped: str) -> None:
    assert not await refused(bootstrapped, "planner", "$KV.lw_scenarios.run-its-own")


@pytest.mark.parametrize("user", USERS)
async def test_every_service_and_the_client_can_pass_a_large_body_by_reference(bootstrapped: str, user: str) -> None:
    settings = Settings(nats_url=bootstrapped, nats_user=user, nats_password=PASSWORDS[user], manage_streams=False)
    bus = Bus(settings, user)
    await bus.connect()
    try:  # a refused publish or consumer would fail the put or the get (no ack, no data)
        nc = bus.broker.connection
        body = os.urandom(1_200_000)
        headers: dict[str, str] = {}
        ref = await bus.payloads.offload(nc, body, headers)
        assert len(ref) < 500
        assert await bus.payloads.inflate(nc, ref, headers) == body
    finally:
        await bus.broker.stop()
