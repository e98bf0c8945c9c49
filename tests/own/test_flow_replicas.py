"""Flow control across replicas and restarts (issue 34): fair share holds with two planner replicas admitting
from one fleet record, and when one of them is killed in the middle of a burst (every run still ends, none
is lost, no slot stays held); a full submit stream refuses the submit at once, typed, through the client and
the CLI."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from loopwarden.client import Client, QuotaExceeded
from loopwarden.stack import LocalStack
from shared import subjects as S
from shared.bus import RUN_ID_HEADER
from shared.canonical import digest_of
from shared.flow import FleetRecord
from shared.messages import RunSubmit
from shared.scenario import parse_scenario
from shared.settings import Settings
from tests.support.stacks import TEST_ENV, running
from tests.support.timing import bound, eventually

FULL_AT = 100  # the submit stream's message bound in the small stack (the least LW_STREAM_MAX_MSGS allows)
TWO_PLANNERS = ("planner", "planner", "executor", "executor", "validator", "judge", "governor", "escalation")
ONE_EACH = ("planner", "executor", "validator", "judge", "governor", "escalation")


def two_turns(seconds: float) -> RunSubmit:
    """A run of two model turns of ``seconds`` each (a calculator call, then the answer)."""
    sc = parse_scenario(
        {
            "name": "two-turns",
            "task": "Add, then say done.",
            "planner": [
                {"latency_s": seconds, "tool_calls": [{"name": "calculator", "input": {"expression": "1+1"}}]},
                {"latency_s": seconds, "text": "done"},
            ],
            "answer_mode": "text",
        }
    )
    data = sc.model_dump(mode="json", by_alias=True)
    return RunSubmit(
        run_id=f"run-{uuid.uuid4().hex[:20]}",
        task=sc.task,
        answer_mode="text",
        scenario=data,
        scenario_digest=digest_of(data),
    )


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    env = {
        **TEST_ENV,
        "LW_TENANT_DAILY_CEILING_USD": "1000",
        "LW_FLOW_CAPACITY": "4",
        "LW_FLOW_SWEEP_S": "0.5",
        "LW_FLOW_GRACE_S": "2",
    }
    yield from running(LocalStack(state_dir=tmp_path_factory.mktemp("replicas"), env=env, services=TWO_PLANNERS))


async def test_fair_share_holds_on_two_planners_and_through_one_killed_mid_burst(replicas: LocalStack) -> None:
    a, b = f"a-{uuid.uuid4().hex[:6]}", f"b-{uuid.uuid4().hex[:6]}"
    async with Client(Settings(nats_url=replicas.nats_url)) as client:
        started: dict[str, float] = {}
        loop = asyncio.get_running_loop()

        async def on_start(msg: Any) -> None:
            started.setdefault((msg.headers or {}).get(RUN_ID_HEADER, ""), loop.time())

        await client.bus.nc.subscribe(S.any_run(S.run_event("started")), cb=on_start)
        burst = [two_turns(0.4).model_copy(update={"tenant": a}) for _ in range(24)]
        # a's burst, each accepted (queued) before b's runs are submitted
        await asyncio.gather(*(client.submit(s) for s in burst))
        late = [two_turns(0.4).model_copy(update={"tenant": b}) for _ in range(4)]
        await asyncio.gather(*(client.submit(s) for s in late))
        # one planner dies in the middle of it all, without a chance to clean up
        victim = next(p for p in replicas.procs if p.service == "planner")
        await eventually(lambda: len(started) >= 8, what="the burst under way", within=bound(60))
        victim.popen.send_signal(signal.SIGKILL)
        victim.popen.wait(bound(10))
        ends = await asyncio.gather(*(client.wait(s.run_id, timeout=bound(180)) for s in (*burst, *late)))
        assert [e.status for e in ends] == ["completed"] * 28, [(e.status, e.final_reason) for e in ends]
        # b's runs were not served after a's backlog: each started before most of a's
        a_starts = sorted(started[s.run_id] for s in burst)
        b_last = max(started[s.run_id] for s in late)
        assert sum(1 for t in a_starts if t > b_last) >= 12, (b_last, a_starts)
        # no slot is left held, nothing is counted as waiting: the dead replica's share was mended by the sweep

        async def settled() -> FleetRecord | None:
            record, _ = await client.bus.kv_get(S.KV_FLOW, "fleet", FleetRecord)
            return record if record is not None and record.total == 0 and record.waiting == 0 else None

        record = await eventually(settled, what="a fleet with nothing held", within=bound(30), every=0.3)
        assert record.finished.get(a) and sum(record.finished[a].values()) == 24
        view = await client.fleet()
        assert view.planners == 1  # the killed replica is no longer counted alive


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loopwarden.cli", *args],
        env={**os.environ, "LW_NATS_URL": url},
        capture_output=True,
        text=True,
        timeout=bound(60),
    )


@pytest.fixture(scope="module")
def small_submit_stream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """Every service but the planner: a planner removes each submit it handled, so the stream fills only while the
    planners are behind (here: none runs until the test starts one)."""
    env = {**TEST_ENV, "LW_STREAM_MAX_MSGS": json.dumps({"LW_SUBMIT": FULL_AT})}
    services = tuple(s for s in ONE_EACH if s != "planner")
    yield from running(LocalStack(state_dir=tmp_path_factory.mktemp("full"), env=env, services=services))


async def test_a_full_submit_stream_refuses_the_submit_at_once_and_typed(
    small_submit_stream: LocalStack, tmp_path: Any
) -> None:
    url = small_submit_stream.nats_url or ""
    path = tmp_path / "s.yaml"
    path.write_text("name: s\ntask: t\nplanner: [{text: done}]\n")
    assert not [p for p in small_submit_stream.procs if p.service == "planner"]  # the stream fills: no planner runs
    async with Client(Settings(nats_url=url)) as client:
        accepted = await asyncio.gather(*(client.submit(two_turns(0.0), accepted=False) for _ in range(FULL_AT)))
        with pytest.raises(QuotaExceeded) as full:
            await client.submit(two_turns(0.0))
        assert (full.value.quota, full.value.limit, full.value.current) == ("submit_stream", FULL_AT, FULL_AT)
        assert "LW_SUBMIT" in full.value.reason and "was not stored" in full.value.reason
        proc = cli(url, "submit", "--scenario", str(path))
        assert proc.returncode == 1, proc.stdout + proc.stderr
        small_submit_stream.wait_ready([small_submit_stream.start_service("planner")])
        assert await client.state(full.value.run_id) is None  # nothing of it was stored
        for run_id in accepted:  # nothing accepted was dropped
            assert (await client.wait(run_id, timeout=bound(60))).status == "completed"
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "the submit stream (LW_SUBMIT) is full" in lines[0], proc.stderr
    assert f"(quota submit_stream: limit {FULL_AT}, current {FULL_AT})" in lines[0]
