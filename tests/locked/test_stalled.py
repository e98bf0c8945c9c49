"""Nothing silent (issue 35, item 1): a run is never left ``running`` by a dead letter or a missing replica, and
a submit refused before it started reaches its submitter.

A private nats-server runs the generated deploy/nats/auth.conf, bootstrapped as admin; every service runs as
its own user (so the planner's reading of LW_DLQ, its requeue and every replica's heartbeat are what the grants
allow). Live runs go through the real Anthropic SDK to the Messages-API stand-in, which answers HTTP 500 for as
long as a test says (the outage). Deliveries give up fast (``LW_ACK_WAIT_S=1``, ``LW_MAX_DELIVER=2``), and a run
waiting on a service with no live replica is marked after 2 s (``LW_STALL_AFTER_S``).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from loopwarden.client import Client, Event, Refused
from loopwarden.fake_model import FakeModel
from loopwarden.stack import LocalStack
from shared import subjects as S
from shared.messages import FINAL_STATUSES, RunSnapshot, RunSubmit
from shared.permissions import operator_roster
from shared.settings import Settings
from tests.support import locked as L
from tests.support.paths import ROOT
from tests.support.stacks import TEST_ENV
from tests.support.timing import bound, eventually

SERVICES = ("planner", "executor", "validator", "governor", "escalation")
FAST = {
    "LW_ACK_WAIT_S": "1",
    "LW_MAX_DELIVER": "2",
    "LW_STALL_AFTER_S": "2",
    "LW_STALL_SWEEP_S": "0.5",
    "LW_REPLICA_TTL_S": "3",
    "LW_ALLOW_SCRIPTED": "false",  # as deployed: a scripted submit is refused at the planner's intake
}
ANSWER = {"content": [{"type": "tool_use", "id": "toolu_done", "name": "submit_result", "input": {"answer": "done"}}]}
CALCULATE = {
    "content": [{"type": "tool_use", "id": "toolu_calc", "name": "calculator", "input": {"expression": "6*7"}}]
}


@pytest.fixture(scope="module")
def fake_model() -> Iterator[FakeModel]:
    server = FakeModel().start()  # a script's key without replies answers HTTP 500: the outage
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def stalled_stack(tmp_path_factory: pytest.TempPathFactory, fake_model: FakeModel) -> Iterator[tuple[str, LocalStack]]:
    tmp = tmp_path_factory.mktemp("stalled")
    env = {s: {"LW_OPERATORS": operator_roster()} for s in SERVICES}
    live = {**TEST_ENV, **FAST, "ANTHROPIC_BASE_URL": fake_model.base_url}
    with L.locked_stack(tmp, "stalled", SERVICES, live, env) as locked:
        yield locked


@pytest.fixture(scope="module")
def url(stalled_stack: tuple[str, LocalStack]) -> str:
    return stalled_stack[0]


def as_user(url: str, user: str, **overrides: Any) -> Settings:
    return L.as_user(url, user, manage_streams=False, rpc_timeout_s=2, **overrides)


@pytest.fixture
async def stalled_client(url: str) -> AsyncIterator[Client]:
    async with Client(as_user(url, "client"), identity="client") as c:
        yield c


@pytest.fixture
async def alice(url: str) -> AsyncIterator[Client]:
    async with Client(as_user(url, "alice"), identity="alice") as c:
        yield c


def lw(url: str, user: str, *args: str) -> subprocess.CompletedProcess[str]:
    drop = ("NATS_URL", "LW_NATS_URL", "LW_STATE_DIR", "XDG_STATE_HOME")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env |= {"LW_NATS_URL": url, "LW_NATS_USER": user, "LW_NATS_PASSWORD": L.PASSWORDS[user]}
    env |= {"LW_MANAGE_STREAMS": "false"}
    return subprocess.run(
        [sys.executable, "-m", "loopwarden.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=bound(60),
        cwd=ROOT,
    )


async def submit_live(client: Client, fake_model: FakeModel, replies: list[dict[str, Any]]) -> str:
    key = f"k{uuid.uuid4().hex[:10]}"
    fake_model.script(key, replies)
    run_id = f"run-stall-{key}"
    await client.submit(RunSubmit(run_id=run_id, task=f"Say done. [script:{key}]"))
    return run_id


@pytest.fixture(scope="module")
async def outage_runs(url: str, fake_model: FakeModel) -> dict[str, str]:
    """A run for each test below that reads a stall, each in a model outage of its own (no reply scripted yet: every
    request answers HTTP 500), all submitted as the first of those tests starts: their delivery budgets (~5 s each)
    run out together, not one test after another. ``tenant``'s is tenant acme's, the others the default tenant's."""
    runs: dict[str, str] = {}
    async with Client(as_user(url, "client"), identity="client") as client:
        for name in ("outage", "requeue", "abort"):
            runs[name] = await submit_live(client, fake_model, [])
    async with Client(as_user(url, "client_acme", tenant="acme"), identity="client_acme") as acme:
        runs["tenant"] = await submit_live(acme, fake_model, [])
    return runs


def end_outage(fake_model: FakeModel, run_id: str, replies: list[dict[str, Any]]) -> None:
    fake_model.script(run_id.removeprefix("run-stall-"), replies)


async def stalled(client: Client, run_id: str, within: float = bound(30)) -> RunSnapshot:
    async def check() -> RunSnapshot | None:
        state = await client.state(run_id)
        return state if state is not None and state.status == "stalled" else None

    return await eventually(check, what=f"run {run_id} stalled", within=within, every=0.2)


def kinds(events: list[Event]) -> list[str]:
    return [e.kind for e in events]


# --- a dead letter -----------------------------------------------------------------------------------------
async def test_a_model_outage_past_the_delivery_budget_stalls_the_run_and_a_requeue_after_it_completes_it(
    url: str, stalled_client: Client, alice: Client, fake_model: FakeModel, outage_runs: dict[str, str]
) -> None:
    run_id = outage_runs["outage"]  # no reply scripted yet: every request answers 500
    state = await stalled(stalled_client, run_id)
    stall = state.stall
    assert stall is not None and len(stall.letters) == 1, stall
    (seq,) = stall.letters
    assert stall.reason.startswith(f"planner gave up on {S.RUN_ADVANCE} (dead letter {seq}): still not ready"), stall
    assert "500" in stall.reason, stall.reason
    # said on the run's subject, and a queue item a person can act on
    events = await stalled_client.events(run_id)
    (said,) = [e for e in events if e.kind == "run.stalled"]
    assert said.payload["status"] == "stalled" and said.payload["detail"]["letter"] == seq

    async def raised() -> list[Any]:  # the queue item is raised by the escalation service, a moment after the stall
        return (await alice.show(stall.escalation_id or "")).escalations

    (item,) = await eventually(raised, what=f"the queue item of {run_id}'s stall", within=bound(15), every=0.2)
    assert (item.kind, item.status, item.allowed_actions) == ("stalled", "open", ["requeue", "abort"])
    assert item.details["letter"] == seq and item.details["service"] == "planner"
    # the run view says so: `loopwarden status` (one line naming the letter and how to hand it back)
    shown = await asyncio.to_thread(lw, url, "client", "status", run_id)
    assert shown.returncode == 0, shown.stderr
    assert "status:      stalled" in shown.stdout, shown.stdout
    assert f"loopwarden dlq requeue {seq}" in shown.stdout, shown.stdout

    end_outage(fake_model, run_id, [ANSWER])  # the provider answers again; an operator hands the letter back
    requeued = await asyncio.to_thread(lw, url, "alice", "dlq", "requeue", str(seq))
    assert requeued.returncode == 0, requeued.stdout + requeued.stderr
    done = await stalled_client.wait(run_id, timeout=bound(30))
    assert done.status == "completed" and done.stall is None, (done.status, done.final_reason, done.stall)
    assert done.final_output == "done"
    order = kinds(await stalled_client.events(run_id))
    stalled_at, completed_at = order.index("run.stalled"), order.index("run.completed")
    assert stalled_at < completed_at, order
    # The letter's handling is said (``run.unstalled``) when it reaches the run before the outcome of the tool call
    # the requeued turn made; when that outcome comes first and ends the run, the ended run's stall goes with it
    # (``stalls.moved``): a race between the two, either way the stall is gone (above) and its item closed (below).
    if "run.unstalled" in order:
        assert stalled_at < order.index("run.unstalled") < completed_at, order
    # the item is closed by the system: nobody needs to decide any more
    closed = (await alice.show(stall.escalation_id or "")).escalations[0]
    assert closed.status == "resolved" and closed.resolution is not None
    assert closed.resolution.resolved_by == "loopwarden", closed.resolution


async def test_a_person_requeues_the_letter_from_the_queue_item_and_the_run_completes(
    stalled_client: Client, alice: Client, fake_model: FakeModel, outage_runs: dict[str, str]
) -> None:
    run_id = outage_runs["requeue"]
    state = await stalled(stalled_client, run_id)
    assert state.stall is not None and state.stall.escalation_id
    end_outage(fake_model, run_id, [ANSWER])
    done = await alice.resolve(state.stall.escalation_id, "alice", "requeue", "the provider is back")
    assert done.ok, done.error
    ended = await stalled_client.wait(run_id, timeout=bound(30))
    assert ended.status == "completed" and ended.final_output == "done", ended.final_reason
    assert "run.unstalled" in kinds(await stalled_client.events(run_id))


async def test_a_person_aborts_a_stalled_run_from_its_queue_item(
    stalled_client: Client, alice: Client, outage_runs: dict[str, str]
) -> None:
    run_id = outage_runs["abort"]
    state = await stalled(stalled_client, run_id)
    assert state.stall is not None and state.stall.escalation_id
    done = await alice.resolve(state.stall.escalation_id, "alice", "abort", "the provider is gone for the day")
    assert done.ok, done.error
    ended = await stalled_client.wait(run_id, timeout=bound(30))
    assert ended.status == "stopped" and ended.stall is None
    assert ended.final_reason == "aborted by alice: the provider is gone for the day", ended.final_reason


async def test_a_tenant_reads_its_stalled_run_through_the_planner(url: str, outage_runs: dict[str, str]) -> None:
    async with Client(as_user(url, "client_acme", tenant="acme"), identity="client_acme") as acme:
        run_id = outage_runs["tenant"]  # submitted as acme
        state = await stalled(acme, run_id)  # rpc.runs.state.acme: the tenant reads no bucket
        assert state.stall is not None and state.stall.letters and "gave up on" in state.stall.reason


# --- a service with no live replica ----------------------------------------------------------------------
async def test_a_stopped_validator_stalls_runs_waiting_on_it_and_they_complete_when_one_is_back(
    stalled_stack: tuple[str, LocalStack], stalled_client: Client, fake_model: FakeModel
) -> None:
    _, stack = stalled_stack
    validator = next(p for p in stack.procs if p.service == "validator" and p.popen.poll() is None)
    validator.popen.terminate()  # a clean stop: it leaves the replica registry at once
    await asyncio.to_thread(validator.popen.wait, bound(15))
    back = None
    try:
        run_id = await submit_live(stalled_client, fake_model, [CALCULATE, ANSWER, ANSWER])
        state = await stalled(stalled_client, run_id, within=bound(30))
        assert state.stall is not None and state.stall.reason == "no live validator replica", state.stall
        assert state.stall.letters == [] and state.stall.escalation_id is None  # it moves on by itself
        (said,) = [e for e in await stalled_client.events(run_id) if e.kind == "run.stalled"]
        assert said.payload["detail"]["reason"] == "no live validator replica"

        back = stack.start_service("validator", label="validator-back", extra_env=L.creds("validator"))
        await asyncio.to_thread(stack.wait_ready, [back])
        done = await stalled_client.wait(run_id, timeout=bound(30))
        assert done.status == "completed" and done.stall is None, (done.status, done.final_reason)
        assert "run.unstalled" in kinds(await stalled_client.events(run_id))
    finally:
        if back is None:  # the module's other tests need a validator
            started = stack.start_service("validator", label="validator-again", extra_env=L.creds("validator"))
            await asyncio.to_thread(stack.wait_ready, [started])


async def test_every_replica_is_in_the_registry_with_its_version_and_durables(url: str) -> None:
    from shared.replica_registry import live_replicas

    async with Client(as_user(url, "alice"), identity="alice") as alice:  # operators read the fleet
        replicas = await live_replicas(alice.bus)
    services = {r.service for r in replicas}
    assert set(SERVICES) <= services, services
    executor = next(r for r in replicas if r.service == "executor")
    assert S.executor_durable("calculator") in executor.durables and executor.version


# --- a submit refused before it started ---------------------------------------------------------------------
async def test_a_malformed_submit_whose_run_id_can_be_read_ends_refused_for_its_submitter(url: str) -> None:
    run_id = f"run-bad-{uuid.uuid4().hex[:10]}"
    body = json.dumps({"run_id": run_id, "task": "", "limits": {"max_iterations": "many"}}).encode()
    async with Client(as_user(url, "client_acme", tenant="acme"), identity="client_acme") as acme:
        await acme.bus.publish(S.run_submit("acme"), body, msg_id=f"submit.{run_id}", run_id=run_id)
        # never a timeout: the reason comes back (``wait`` raises it unless ``until`` names ``refused``)
        with pytest.raises(Refused) as told:
            await acme.wait(run_id, timeout=bound(20))
        state = await acme.wait(run_id, timeout=bound(20), until=FINAL_STATUSES)
    assert told.value.reason == state.final_reason and told.value.quota is None
    assert state.status == "refused", state.status
    assert (state.final_reason or "").startswith("does not match contract RunSubmit"), state.final_reason


def test_submit_wait_of_a_submit_the_planner_refuses_exits_1_with_the_reason(url: str, tmp_path: Path) -> None:
    path = tmp_path / "scripted.yaml"
    path.write_text(yaml.safe_dump({"name": "scripted", "task": "Say done.", "planner": [{"text": "done"}]}))
    done = lw(url, "client", "submit", "--scenario", str(path), "--wait", "--timeout", f"{bound(30):g}")
    assert done.returncode == 1, done.stdout + done.stderr
    # refused at the door: one line naming the run and the reason (the submit returns only once accepted)
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("loopwarden submit: run run-") and done.stdout == "", done.stdout + done.stderr
    assert line.endswith(" refused: scenario: scripted runs are not allowed here (LW_ALLOW_SCRIPTED=false)"), line
    assert "Traceback" not in done.stderr and "timed out" not in done.stderr, done.stderr


async def test_a_replay_the_planner_refuses_ends_at_once_with_the_reason(
    url: str, stalled_client: Client, fake_model: FakeModel
) -> None:
    from loopwarden.records import collect
    from loopwarden.replay import replay

    run_id = await submit_live(stalled_client, fake_model, [ANSWER])
    assert (await stalled_client.wait(run_id, timeout=bound(30))).status == "completed"
    async with Client(as_user(url, "admin"), identity="admin") as admin:
        record = await collect(admin.bus, run_id)
    started = asyncio.get_running_loop().time()
    report = await replay(stalled_client, record, timeout=bound(60))  # a replay is a scripted run: refused here
    assert report.status == "refused", report
    assert report.mismatches == [
        "the replay was refused: scenario: scripted runs are not allowed here (LW_ALLOW_SCRIPTED=false)"
    ]
    assert asyncio.get_running_loop().time() - started < bound(20)  # not the 60 s it may wait
