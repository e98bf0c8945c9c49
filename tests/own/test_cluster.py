"""Three JetStream nodes on loopback, run from deploy/nats/cluster.conf and managed like a deployment.

Services connect as their own users with ``LW_MANAGE_STREAMS=false``: started before bootstrap
they wait instead of exiting; ``loopwarden bootstrap`` (admin) puts the streams and buckets at
3 replicas and creates every durable; a client connecting with default settings changes none of
it and no service may change its consumer. A server without the route credentials cannot join.
The command stream's leader is SIGKILLed under load: every run completes, 0 lost, 0 doubled.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import ConsumerConfig
from nats.js.client import JetStreamContext
from nats.js.errors import NoStreamResponseError

from bench.chaos import failed_visibly
from loopwarden.client import Client, new_run_id
from loopwarden.infra import bootstrap
from loopwarden.stack import PROCESSES, LocalStack, Proc, free_port, nats_server_binary, open_log, read_from, tail
from services.executor.app import load_registry
from shared import subjects as S
from shared.scenario import parse_scenario
from shared.settings import Settings
from tests.support.cluster import CLUSTER_CONF, Cluster, route_names
from tests.support.paths import ROOT
from tests.support.payments import count_charges
from tests.support.runs import escalations_of
from tests.support.stacks import TEST_ENV
from tests.support.timing import bound

TOOLS_DIR = ROOT / "tests" / "tools"
# The default delivery budget (0.5 s doubling over 6 deliveries, ~15 s), not the suite's quick
# one (~3 s): a handler whose publish meets a stream electing its new leader is redelivered;
# the budget must outlast an election on a loaded machine, or the message is dead-lettered.
CLUSTER_ENV = {**TEST_ENV, "LW_MAX_DELIVER": "6", "LW_REDELIVER_DELAY_S": "0.5", "LW_TOOL_CONTRACT_DIR": str(TOOLS_DIR)}
STREAMS = tuple(S.STREAM_SUBJECTS)
BUCKET_STREAMS = tuple(f"KV_{b}" for b in S.ALL_BUCKETS)


def tool_names() -> list[str]:
    return sorted(load_registry(Settings(tool_contract_dir=str(TOOLS_DIR))).tools)


def admin_settings(cluster: Cluster, **overrides: Any) -> Settings:
    """The admin as bootstrap runs it: the same consumer settings the services run with."""
    return cluster.settings(
        "admin",
        tool_contract_dir=str(TOOLS_DIR),
        ack_wait_s=float(CLUSTER_ENV["LW_ACK_WAIT_S"]),
        max_deliver=int(CLUSTER_ENV["LW_MAX_DELIVER"]),
        **overrides,
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("cluster"), tools=tool_names()) as c:
        yield c


@dataclass
class Managed:
    stack: LocalStack
    before_bootstrap: dict[str, str]  # each service's log while bootstrap had not run yet
    bootstrap_changes: list[str]


@pytest.fixture(scope="module")
def managed(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Managed]:
    """The six services started on the fresh cluster *before* bootstrap, then bootstrap."""
    stack = LocalStack(
        state_dir=tmp_path_factory.mktemp("managed"),
        nats_url=cluster.url,
        env=CLUSTER_ENV,
        env_per_service={s: cluster.service_env(s) for s in PROCESSES},
    )
    procs = [stack.start_service(s) for s in PROCESSES]
    try:
        deadline = time.monotonic() + bound(60)
        before: dict[str, str] = {}
        while time.monotonic() < deadline and len(before) < len(procs):
            for p in procs:
                if p.popen.poll() is not None:
                    raise AssertionError(f"{p.name} exited before bootstrap:\n{tail(p.log)}")
                text = read_from(p.log, p.log_start).decode(errors="replace")
                if "waiting for" in text:
                    before[p.service] = text
            time.sleep(0.2)
        assert len(before) == len(procs), {p.name: tail(p.log) for p in procs if p.service not in before}
        changes = asyncio.run(bootstrap(admin_settings(cluster))).changed
        stack.wait_ready(procs, timeout=bound(90))
        yield Managed(stack, before, changes)
    finally:
        stack.stop()


@contextlib.asynccontextmanager
async def admin_js(cluster: Cluster) -> AsyncIterator[JetStreamContext]:
    nc = await nats.connect(cluster.url.split(","), user="admin", password=cluster.passwords["admin"])
    try:
        yield nc.jetstream()
    finally:
        await nc.close()


async def replicas(js: JetStreamContext) -> dict[str, int | None]:
    return {name: (await js.stream_info(name)).config.num_replicas for name in (*STREAMS, *BUCKET_STREAMS)}


async def charges(js: JetStreamContext, run_id: str) -> int:
    return await count_charges(js, run_id)


# --- managed infrastructure --------------------------------------------------------------------


def test_a_bounded_wait_for_bootstrap_stops_the_service_naming_what_is_missing(tmp_path: Path) -> None:
    stack = LocalStack(state_dir=tmp_path, env={"LW_MANAGE_STREAMS": "false", "LW_INFRA_WAIT_S": "1"})
    stack.start_nats()
    try:
        governor = stack.start_service("governor")
        assert governor.popen.wait(bound(30)) != 0
        text = governor.log.read_text()
        assert "governor: stream LW_CMD not ready after" in text and "LW_INFRA_WAIT_S" in text, tail(governor.log)
    finally:
        stack.stop()


def test_services_started_before_bootstrap_wait_for_it_instead_of_exiting(managed: Managed) -> None:
    for service in PROCESSES:  # the console is a client: it waits only for the stream it submits to
        stream = "LW_SUBMIT" if service == "console" else "LW_CMD"
        assert f"waiting for stream {stream}" in managed.before_bootstrap[service], managed.before_bootstrap[service]
    assert any(c.startswith("created consumer LW_CMD/executor_transfer_funds") for c in managed.bootstrap_changes)
    assert all(p.popen.poll() is None for p in managed.stack.procs)


async def test_bootstrap_sets_three_replicas_and_an_ordinary_client_changes_nothing(
    cluster: Cluster, managed: Managed
) -> None:
    async with admin_js(cluster) as js:
        assert set((await replicas(js)).values()) == {3}
    # The defaults of an ordinary `loopwarden submit` (create-on-first-use, replicas 1), with
    # rights to change streams: it used to re-apply replicas 1 to every stream.
    ordinary = cluster.settings("admin", manage_streams=True, stream_replicas=1, nats_url=cluster.nodes[0].url)
    async with Client(ordinary) as client:
        run_id = await client.submit_scenario(parse_scenario(calculation("ordinary")))
        state = await client.wait(run_id, timeout=bound(60))
        assert state.status == "completed", state.final_reason
    async with admin_js(cluster) as js:
        assert set((await replicas(js)).values()) == {3}
    # Running bootstrap again is a no-op.
    assert (await bootstrap(admin_settings(cluster))).changed == []


async def test_a_service_cannot_change_its_own_consumer(cluster: Cluster, managed: Managed) -> None:
    """The judge widening its filter to every command (and reading them) is refused by the server."""
    errors: list[str] = []

    async def on_error(err: Exception) -> None:
        errors.append(str(err))

    nc = await nats.connect(
        cluster.nodes[0].url,
        user="judge",
        password=cluster.passwords["judge"],
        inbox_prefix="_INBOX_judge",
        error_cb=on_error,
    )
    try:
        widened = ConsumerConfig(durable_name="judge", filter_subjects=[f"{S.P}.cmd.>"], ack_wait=3.0)
        with pytest.raises(Exception):  # noqa: B017 - refused: a timeout after the permissions violation
            await nc.jetstream(timeout=bound(1.0)).add_consumer(S.STREAM_CMD, widened)
    finally:
        await nc.close()
    assert any("permissions violation" in e.lower() for e in errors), errors
    async with admin_js(cluster) as js:
        info = await js.consumer_info(S.STREAM_CMD, "judge")
    assert info.config.filter_subjects == [S.JUDGE_SCORE]


# --- a secured cluster --------------------------------------------------------------------------


@pytest.mark.parametrize("credentials", ["", "route:wrong-password@"], ids=["no-credentials", "wrong-password"])
async def test_a_node_without_the_route_credentials_cannot_join(
    cluster: Cluster, tmp_path: Path, credentials: str
) -> None:
    port, cluster_port, http_port = free_port(), free_port(), free_port()
    conf = tmp_path / "rogue.conf"
    routes = ", ".join(f"nats://{credentials}127.0.0.1:{n.cluster_port}" for n in cluster.nodes)
    conf.write_text(
        f"listen: 127.0.0.1:{port}\nhttp: 127.0.0.1:{http_port}\nserver_name: rogue\n"
        f"cluster {{ name: loopwarden, listen: 127.0.0.1:{cluster_port}, routes: [{routes}] }}\n"
    )
    log = tmp_path / "rogue.log"
    stdout = open_log(log)
    rogue = await asyncio.create_subprocess_exec(nats_server_binary(), "-c", str(conf), stdout=stdout, stderr=stdout)
    stdout.close()
    try:
        for _ in range(int(bound(100))):
            if b"Authorization Violation" in log.read_bytes():
                break
            await asyncio.sleep(0.05)
        spy = await nats.connect(f"nats://127.0.0.1:{port}")
        peer = await nats.connect(cluster.nodes[1].url, user="admin", password=cluster.passwords["admin"])
        sender = await nats.connect(cluster.nodes[0].url, user="admin", password=cluster.passwords["admin"])
        try:
            leaked = await spy.subscribe(">")
            delivered = await peer.subscribe(f"{S.P}.evt.probe")
            await spy.flush()
            await peer.flush()
            await asyncio.sleep(bound(0.3))  # interest propagates over routes
            for _ in range(5):
                await sender.publish(f"{S.P}.evt.probe", b"account traffic")
            await sender.flush()
            await asyncio.sleep(bound(0.5))
            assert delivered.pending_msgs == 5  # the real cluster routes it
            assert leaked.pending_msgs == 0  # the rogue never sees it
        finally:
            for nc in (spy, peer, sender):
                await nc.close()
        assert b"Authorization Violation" in log.read_bytes(), tail(log)
        assert all("rogue" not in route_names(n) for n in cluster.nodes)
    finally:
        rogue.kill()
        await rogue.wait()


def test_monitoring_listens_on_loopback_only(cluster: Cluster) -> None:
    assert "http: 127.0.0.1:8222" in CLUSTER_CONF.read_text().splitlines()
    for node in cluster.nodes:
        assert node.monitor("varz")["http_host"] == "127.0.0.1"


# --- faults are visible -------------------------------------------------------------------------


async def test_a_service_logs_losing_and_regaining_its_server(cluster: Cluster, managed: Managed) -> None:
    node = cluster.nodes[2]
    pinned = managed.stack.start_service(
        "governor", label="governor-pinned", extra_env={**cluster.service_env("governor"), "LW_NATS_URL": node.url}
    )
    try:
        await asyncio.to_thread(managed.stack.wait_ready, [pinned])
        cluster.kill(node)
        assert await log_shows(pinned, "governor: disconnected from NATS"), tail(pinned.log)
        cluster.start_node(node)
        assert await log_shows(pinned, "governor: reconnected to NATS"), tail(pinned.log)
        assert pinned.popen.poll() is None
    finally:
        if not node.running:
            cluster.start_node(node)
        pinned.popen.terminate()
        await asyncio.to_thread(pinned.popen.wait, 15)
        managed.stack.procs.remove(pinned)
        await asyncio.to_thread(cluster.wait_healthy)


async def log_shows(proc: Proc, text: str, timeout: float = bound(20.0)) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text.encode() in read_from(proc.log, proc.log_start):
            return True
        await asyncio.sleep(0.1)
    return False


# --- the stream leader dies under load ------------------------------------------------------------


def calculation(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "task": "Add, then submit.",
        "planner": [
            {"tool_calls": [{"name": "calculator", "input": {"expression": "20+22"}}]},
            {"tool_calls": [{"name": "submit_result", "input": {"answer": "42"}}]},
        ],
    }


def payment(name: str, tool: str) -> dict[str, Any]:
    """A run that moves money once (``transfer_funds`` is not idempotent), between two other calls."""
    args = {"customer_id": "cus_leader", "amount_cents": 700, "currency": "eur"}
    return {
        "name": name,
        "task": "Check, pay, confirm.",
        "planner": [
            {"tool_calls": [{"name": "calculator", "input": {"expression": "7*100"}}]},
            {"tool_calls": [{"name": tool, "id": "toolu_pay", "input": args}]},
            {"tool_calls": [{"name": "calculator", "input": {"expression": "700/100"}}]},
            {"tool_calls": [{"name": "submit_result", "input": {"answer": "paid 7 EUR"}}]},
        ],
    }


async def submit(client: Client, scenario: dict[str, Any], run_id: str, timeout: float = bound(60.0)) -> str:
    """Submit as a user would during a fail-over: a timed-out submit is sent again (the same run
    id: the scenario write is the same value, the submit de-duplicated by its message id)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await client.submit_scenario(parse_scenario(scenario), run_id=run_id)
        except (TimeoutError, NatsTimeoutError, NoRespondersError, NoStreamResponseError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def move_leader_off(cluster: Cluster, stream: str, node: str) -> None:
    nc = await nats.connect(cluster.url.split(","), user="admin", password=cluster.passwords["admin"])
    try:
        js = nc.jetstream()
        for _ in range(int(bound(50))):
            info = (await js.stream_info(stream)).cluster
            if info is not None and info.leader not in (None, node):
                return
            with contextlib.suppress(Exception):
                await nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", b"", timeout=bound(2))
            await asyncio.sleep(0.2)
        raise AssertionError(f"{stream} still led by {node}")
    finally:
        await nc.close()


async def test_killing_the_stream_leader_under_load_loses_and_doubles_nothing(
    cluster: Cluster, managed: Managed
) -> None:
    scenarios = [payment(f"leader-pay-{i}", "transfer_funds") for i in range(6)]
    scenarios += [payment(f"leader-sync-{i}", "sync_ledger") for i in range(3)]
    scenarios += [calculation(f"leader-calc-{i}") for i in range(3)]
    async with Client(cluster.settings("client")) as client, admin_js(cluster) as js:
        run_ids = [new_run_id() for _ in scenarios]
        submits = [submit(client, s, r) for s, r in zip(scenarios, run_ids, strict=True)]
        first = await asyncio.gather(*submits[:6])
        await asyncio.sleep(0.5)  # runs are in flight
        leader = (await js.stream_info(S.STREAM_CMD)).cluster
        assert leader is not None and leader.leader is not None
        victim = cluster.node(leader.leader)
        # The demo payment ledger (lw_demo) stands in for the payment provider, a system outside
        # ours: its store must not die with our node, or the tool itself crashes (a fatal failure,
        # a human's call). Its leadership moves elsewhere first; everything else stays put.
        await move_leader_off(cluster, f"KV_{S.KV_DEMO}", victim.name)
        cluster.kill(victim)
        rest = await asyncio.gather(*submits[6:])  # while the stream elects a new leader
        assert [*first, *rest] == run_ids
        states = await asyncio.gather(
            *(
                client.wait(r, timeout=bound(90), until=("completed", "stopped", "failed", "awaiting_human"))
                for r in run_ids
            )
        )
        cluster.start_node(victim)  # back to three for the tests that follow
        # A paying call whose result the executor could not record while the stream had no leader (its lease
        # lapsed on a machine this loaded) waits for a person on an unknown_outcome item, as the chaos runs
        # count it: not lost, and never charged twice (below). Anything else must have completed.
        unknown = {
            s.run_id
            for s in states
            if s.status == "awaiting_human"
            and {e.kind for e in await escalations_of(client, s.run_id)} == {"unknown_outcome"}
        }
        not_completed = {
            s.run_id: (s.status, s.final_reason) for s in states if s.status != "completed" and s.run_id not in unknown
        }
        assert not not_completed, f"killed leader {victim.name}: {not_completed}"
        paid = {
            r: await charges(js, r)
            for r, s in zip(run_ids, scenarios, strict=True)
            if s["name"].startswith("leader-pay")
        }
        history = {r: [e.kind for e in await client.events(r)] for r, n in paid.items() if n != 1}
        doubled = {r: n for r, n in paid.items() if n > 1}
        print(f"killed {victim.name}, leader of {S.STREAM_CMD}; charges per paying run: {paid}; not once: {history}")
        # Not charged is allowed only as a failure the model was told about (the run went on).
        # (or as a person's open unknown_outcome item: the person finds out whether it was charged)
        lost = {
            r
            for r, n in paid.items()
            if n == 0 and r not in unknown and not await failed_visibly(client, r, "transfer_funds")
        }
        assert not lost and not doubled, (paid, history)
        new_leader = (await js.stream_info(S.STREAM_CMD)).cluster
        assert new_leader is not None and new_leader.leader != victim.name
    cluster.wait_healthy()
