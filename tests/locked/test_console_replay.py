"""The console's NATS user may start a replay where the server enforces the grants (``deploy/nats/auth.conf``):
on the operators' replay subject of the replayed run's tenant (``S.run_replay``), and on no tenant's own submit
subject (a replay is not a client's run)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml

from loopwarden.client import Client
from loopwarden.replay import replay_scenario
from shared import subjects as S
from shared.records import RunRecord
from tests.support import locked as L
from tests.support.paths import ROOT


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with L.locked_server(tmp_path_factory.mktemp("replay-grant"), "replaygrant") as url:
        yield url


async def test_the_consoles_user_submits_a_replay_on_the_replay_subject_and_no_tenants_submit(url: str) -> None:
    await L.bootstrap_as_admin(url)
    recorded = RunRecord.model_validate(
        {
            "run_id": "run-recorded1",
            "exported_at": "2026-01-01T00:00:00Z",
            "task": yaml.safe_load((ROOT / "scenarios" / "demo.yaml").read_text())["task"],
            "status": "completed",
            "final_output": "done",
            "provider": "scripted",
            "config": {},
            "model_calls": [{"key": "run-recorded1.turn1", "purpose": "plan", "n": 1, "response": {"text": "done"}}],
        }
    )
    settings = L.as_user(url, "console", manage_streams=False, rpc_timeout_s=3)
    async with Client(settings, identity="console") as console:  # acknowledged by LW_SUBMIT
        run_id = await console.submit_replay(replay_scenario(recorded), "acme", "run-replayed1")
    async with Client(L.as_user(url, "admin"), identity="admin") as admin:
        stored = await admin.bus.js.get_last_msg(S.STREAM_SUBMIT, S.run_replay("acme"))
        assert stored.data is not None and run_id.encode() in stored.data
    assert await L.publish_refusals(url, "console", S.run_submit("acme"))
    assert await L.publish_refusals(url, "console", S.run_submit(S.DEFAULT_TENANT))
