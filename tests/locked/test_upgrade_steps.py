"""What docs/upgrades.md says a release needs, on a locked stack: a replica whose durable consumer is gone
says so on ``/readyz`` (naming it) instead of "connected and consuming", and ``loopwarden bootstrap`` as the
admin - the step the doc puts before rolling the services - brings it back to ready, consuming again."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from pathlib import Path

import nats

from loopwarden.infra import bootstrap
from loopwarden.stack import free_port
from shared import subjects as S
from tests.support import locked as L
from tests.support.stacks import TEST_ENV
from tests.support.timing import bound, eventually_sync


def _readyz(port: int) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=bound(3)) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


async def _delete_consumer(url: str, stream: str, durable: str) -> None:
    nc = await nats.connect(url, user="admin", password=L.PASSWORDS["admin"])
    try:
        await nc.jetstream().delete_consumer(stream, durable)
    finally:
        await nc.close()


def test_a_replica_whose_consumer_was_deleted_is_not_ready_until_bootstrap(tmp_path: Path) -> None:
    health = free_port()
    per_service = {"escalation": {"LW_HEALTH_PORT": str(health)}}
    with L.locked_stack(tmp_path, "upgrade-steps", ("escalation",), dict(TEST_ENV), per_service) as (url, _):
        eventually_sync(lambda: _readyz(health)[0] == 200, what="the escalation service ready", within=bound(30))
        # a release that adds a consumer, started before bootstrap made it, is this state too
        asyncio.run(_delete_consumer(url, S.STREAM_CMD, S.DURABLE_ESCALATION_WITHDRAW))
        _, body = eventually_sync(
            lambda: (said := _readyz(health))[0] == 503 and said,
            what="/readyz saying the consumer is gone",
            within=bound(30),
        )
        assert f"consumer {S.STREAM_CMD}/{S.DURABLE_ESCALATION_WITHDRAW} is gone" in str(body["detail"]), body
        assert "loopwarden bootstrap" in str(body["detail"]) and body["ready"] is False
        asyncio.run(bootstrap(L.as_user(url, "admin")))
        eventually_sync(lambda: _readyz(health)[0] == 200, what="ready again after bootstrap", within=bound(30))
