"""Who may bind a scenario and move large bodies, enforced by the server (deploy/nats/auth.conf).

Only the planner writes ``lw_scenarios`` (create-only, from the submit message): a client that
tries to overwrite a run's stored scenario is refused by the server. Every service and the client
may store and read large bodies in the claim-check bucket.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest

from shared.bus import Bus
from shared.settings import Settings
from tests.support import locked as L
from tests.support.locked import PASSWORDS

USERS = ("planner", "executor", "validator", "judge", "governor", "escalation", "client")


@pytest.fixture(scope="module")
async def bootstrapped(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    with L.locked_server(tmp_path_factory.mktemp("scenarios")) as url:
        await L.bootstrap_as_admin(url)
        yield url


async def refused(server: str, user: str, subject: str) -> list[str]:
    return await L.publish_refusals(server, user, subject, b'{"name":"forged","task":"x","tools":{}}')


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
