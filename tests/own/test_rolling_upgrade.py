"""Rolling upgrade and rollback under load: the last release and the current tree side by side.

The last release (``releases.toml``) is unpacked with ``git archive <commit>`` (no tags needed) and
run from there with the same virtualenv's dependencies (``PYTHONPATH`` at the unpacked tree,
``PYTHONSAFEPATH`` so the test's working directory - this tree - is not imported first). Its
replicas announce its version: every replica's health endpoint is asked, and the ``Lw-Version``
header of what each service publishes and the ``service.version`` of its spans must show both
releases, which proves the old code is what ran.

One real nats-server, one replica of each service. Runs are submitted all along (a calculator
step, then one in three pays once with the non-idempotent ``transfer_funds``, one in three syncs a
ledger, then a submit) while each service in turn, in docs/upgrades.md's order, is replaced: the other
version started, ready, then the replica it replaces stopped with SIGTERM (it drains). Every run completes, none is
lost, none charged twice, nothing is dead-lettered. The long form (two rounds each way, a run every 0.35 s):
``LW_LONG_UPGRADE=1 .venv/bin/pytest tests/own/test_rolling_upgrade.py -m slow -s``.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
import tomllib
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from loopwarden.client import Client, new_run_id
from loopwarden.stack import LocalStack, Proc, free_port, tail
from shared.scenario import parse_scenario
from shared.settings import Settings
from shared.version import SERVICE_HEADER, VERSION_HEADER, package_version, version_from_pyproject
from tests.support.otlp_collector import OtlpCollector
from tests.support.paths import ROOT
from tests.support.payments import count_charges
from tests.support.stacks import TEST_ENV
from tests.support.timing import bound

SERVICES = ("planner", "executor", "validator", "judge", "governor", "escalation")
# docs/upgrades.md's order for this release: the readers of what it widens first (a queue item's kind
# ``stalled``, the statuses ``stalled`` and ``refused``), the planner that writes them last; a rollback the
# other way round
UPGRADE_ORDER = ("escalation", "executor", "validator", "judge", "governor", "planner")
RELEASE: dict[str, Any] = tomllib.loads((ROOT / "releases.toml").read_text())["release"][-1]
OLD, NEW = str(RELEASE["version"]), package_version()
PUBLISHING = ("planner", "executor", "validator", "judge")  # what this workload makes each of them publish
STEPS = 6  # calculator turns per run: a run lasts long enough to be in flight when a replica stops
TURN_S = 0.1  # the scripted model's time per calculator turn (an idle machine finished runs within the 0.2 s)


def scenario(i: int) -> dict[str, Any]:
    """Calculator turns; every third run pays once (not idempotent), every third syncs a ledger
    (idempotent); then an answer the judge scores (so the judge works too)."""
    kind = ("pay", "sync", "calc")[i % 3]
    steps: list[dict[str, Any]] = [
        # each turn takes a moment, so a run is surely under way when a replica stops, loaded machine or not
        {"tool_calls": [{"name": "calculator", "input": {"expression": f"{i}+{k}"}}], "latency_s": TURN_S}
        for k in range(STEPS)
    ]
    if kind != "calc":
        tool = "transfer_funds" if kind == "pay" else "sync_ledger"
        args = {"customer_id": f"cus_roll{i:04d}", "amount_cents": 100 + i, "currency": "eur"}
        steps.insert(1, {"tool_calls": [{"name": tool, "id": "toolu_money", "input": args}]})
    steps.append({"tool_calls": [{"name": "submit_result", "input": {"answer": f"done {i}"}}]})
    return {
        "name": f"rolling-{kind}-{i}",
        "task": "Work, then submit.",
        "planner": steps,
        "judge": [{"scores": {"accurate": 0.9}}],
        "rubric": {"criteria": [{"name": "accurate"}]},
        "limits": {"max_iterations": STEPS + 5},
    }


@dataclass
class Replica:
    service: str
    version: str
    proc: Proc
    health_port: int


@dataclass
class Figures:
    direction: str
    runs: int = 0
    replacements: int = 0
    completed: int = 0
    lost: list[str] = field(default_factory=list)
    doubled: dict[str, int] = field(default_factory=dict)
    unfinished: dict[str, str] = field(default_factory=dict)
    in_flight: list[int] = field(default_factory=list)  # runs not finished when each old replica was stopped
    dead_letters: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def report(self) -> str:
        return (
            f"{self.direction}: runs {self.runs}, replacements {self.replacements}, completed {self.completed}, "
            f"lost {len(self.lost)}, doubled {len(self.doubled)}, unfinished {len(self.unfinished)}, "
            f"dead-lettered {len(self.dead_letters)}; in flight at each stop {self.in_flight}; {self.seconds:.0f} s"
            + "".join(f"\n  LOST {r}" for r in self.lost)
            + "".join(f"\n  DOUBLED {r}: {n} charges" for r, n in self.doubled.items())
            + "".join(f"\n  UNFINISHED {r}: {why}" for r, why in self.unfinished.items())
            + "".join(f"\n  DEAD-LETTERED {d}" for d in self.dead_letters)
        )


class Fleet:
    """One replica of each service, each of either release; ``replace`` swaps one for the other version."""

    def __init__(self, stack: LocalStack, release: Path) -> None:
        self.stack, self.release = stack, release
        self.current: dict[str, Replica] = {}
        self.announced: list[tuple[str, str, str]] = []  # (service, version started, version its health said)
        self.stopping: list[asyncio.Task[None]] = []
        self._n = 0

    def _env(self, version: str) -> dict[str, str]:
        if version == NEW:
            return {"LW_TOOL_CONTRACT_DIR": str(ROOT / "tests" / "tools")}
        tree = str(self.release)
        return {
            "PYTHONPATH": tree,
            "PYTHONSAFEPATH": "1",
            "LW_TOOL_CONTRACT_DIR": str(self.release / "tests" / "tools"),
        }

    def start(self, service: str, version: str) -> Replica:
        self._n += 1
        port = free_port()
        env = {**self._env(version), "LW_HEALTH_PORT": str(port)}
        proc = self.stack.start_service(service, label=f"{service}-{version}-{self._n}", extra_env=env)
        return Replica(service, version, proc, port)

    def ready(self, replicas: list[Replica]) -> None:
        self.stack.wait_ready([r.proc for r in replicas])
        for r in replicas:
            with urllib.request.urlopen(f"http://127.0.0.1:{r.health_port}/livez", timeout=bound(5)) as resp:
                said = json.loads(resp.read())
            self.announced.append((r.service, r.version, str(said.get("version"))))
            assert said.get("version") == r.version, f"{r.proc.name} says it runs {said}: the wrong code was imported"

    async def replace(
        self, service: str, version: str, before_stop: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """Start ``service`` at ``version``, wait until it is ready, then SIGTERM the replica it replaces."""
        new = self.start(service, version)
        await asyncio.to_thread(self.ready, [new])
        if before_stop is not None:
            await before_stop()
        old = self.current[service]
        old.proc.popen.send_signal(signal.SIGTERM)
        self.current[service] = new
        self.stopping.append(asyncio.create_task(self._stopped(old)))  # it drains while the next one starts

    async def _stopped(self, old: Replica) -> None:
        code = await asyncio.to_thread(old.proc.popen.wait, 30)
        assert code == 0, f"{old.proc.name} exited with {code} on SIGTERM:\n{tail(old.proc.log)}"
        self.stack.procs.remove(old.proc)

    async def settled(self) -> None:
        """Every replaced replica has exited (cleanly: the assertion of ``_stopped``)."""
        stopping, self.stopping = self.stopping, []
        await asyncio.gather(*stopping)


@pytest.fixture(scope="module")
def release_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The last release's source, from the commit ``releases.toml`` records."""
    out = tmp_path_factory.mktemp(f"release-{OLD}")
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", RELEASE["commit"]], capture_output=True, timeout=bound(60)
    )
    assert archive.returncode == 0, f"git archive {RELEASE['commit']} ({OLD}): {archive.stderr.decode()}"
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(out, filter="data")
    assert version_from_pyproject(out / "pyproject.toml") == OLD, "releases.toml names a commit of another version"
    # compiled once here, not by six services importing the same fresh sources at once
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", "-j0", str(out / "shared"), str(out / "services")], check=True
    )
    assert OLD != NEW, f"the tree is still at the release's version {OLD}: bump pyproject.toml"
    return out


@pytest.fixture(scope="module")
def collector() -> Iterator[OtlpCollector]:
    own = OtlpCollector().start()  # this module's spans only
    yield own
    own.stop()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, release_tree: Path, collector: OtlpCollector) -> Iterator[Fleet]:
    # The ack wait is how long a replica may go unheard before its messages are given to another: a liveness
    # bound like any other, on the suite's time scale (a loaded machine can starve a replica of CPU).
    env = {
        **TEST_ENV,
        "LW_ACK_WAIT_S": f"{bound(3):g}",
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "300",
    }
    stack = LocalStack(state_dir=tmp_path_factory.mktemp("rolling"), env=env, services=())
    stack.start()
    try:
        fleet = Fleet(stack, release_tree)
        replicas = [fleet.start(s, OLD) for s in SERVICES]
        fleet.ready(replicas)
        fleet.current = {r.service: r for r in replicas}
        yield fleet
    finally:
        stack.stop()


@pytest.fixture
async def fleet_client(fleet: Fleet) -> AsyncIterator[Client]:
    assert fleet.stack.nats_url is not None
    async with Client(Settings(nats_url=fleet.stack.nats_url)) as c:
        yield c


async def roll(
    fleet: Fleet, client: Client, to: str, *, rounds: int = 1, every: float = 0.5, warmup: float = 1.0
) -> Figures:
    """Runs submitted every ``every`` seconds while each service in turn is replaced by its ``to`` version
    (``rounds`` times: back and forth); every run waited for and its charges counted."""
    back = OLD if to == NEW else NEW

    def turn(version: str) -> list[tuple[str, str]]:
        return [(s, version) for s in (UPGRADE_ORDER if version == NEW else UPGRADE_ORDER[::-1])]

    order = [step for r in range(rounds) for step in turn(to if r % 2 == 0 else back)]
    figures = Figures(direction=f"{back} -> {to}" + (f" ({rounds} rounds)" if rounds > 1 else ""))
    plans: dict[str, dict[str, Any]] = {}
    finished: dict[str, str] = {}
    waiters: list[asyncio.Task[None]] = []
    stop = asyncio.Event()
    started = time.monotonic()

    async def wait_for(run_id: str) -> None:
        try:
            state = await client.wait(run_id, timeout=bound(120))
            finished[run_id] = state.status if state.status == "completed" else f"{state.status}: {state.final_reason}"
        except TimeoutError as err:
            finished[run_id] = f"not finished: {err}"

    async def submit() -> None:
        run_id, plan = new_run_id(), scenario(len(plans))
        plans[run_id] = plan
        await client.submit_scenario(parse_scenario(plan), run_id=run_id)
        waiters.append(asyncio.create_task(wait_for(run_id)))

    async def submitter() -> None:
        while not stop.is_set():
            await submit()
            await asyncio.sleep(every)

    async def burst_then_count() -> None:
        """A few more runs just before a replica stops (so some are surely mid-flight), then the count."""
        for _ in range(3):
            await submit()
        await asyncio.sleep(0.2)  # under way
        figures.in_flight.append(len(plans) - len(finished))

    earlier = {n.seq for n in await client.letters()}  # the module's stack is shared: only this roll's letters count
    submitting = asyncio.create_task(submitter())
    try:
        await asyncio.sleep(warmup)  # runs in flight before the first replacement
        for service, version in order:
            await ask_escalations(client)  # the escalation replica answers (a span of its version)
            await fleet.replace(service, version, burst_then_count)
            figures.replacements += 1
        await fleet.settled()  # the replaced escalation replica gone: only the new one can answer now
        await ask_escalations(client)
    finally:
        stop.set()
        await submitting
    await asyncio.gather(*waiters, fleet.settled())
    figures.runs = len(plans)

    async def count(run_id: str, plan: dict[str, Any]) -> None:
        async with asking:
            await count_one(run_id, plan)

    async def count_one(run_id: str, plan: dict[str, Any]) -> None:
        outcome = finished.get(run_id, "")
        if await client.state(run_id) is None:
            figures.lost.append(run_id)
            return
        if outcome == "completed":
            figures.completed += 1
        else:
            figures.unfinished[run_id] = outcome
        paid = await count_charges(client.bus.js, run_id)
        if plan["name"].startswith("rolling-pay") and paid != 1:
            if paid > 1:
                figures.doubled[run_id] = paid
            else:
                figures.lost.append(f"{run_id} (completed without its payment)")

    asking = asyncio.Semaphore(8)  # a loaded machine: a few questions at a time, not a hundred
    await asyncio.gather(*(count(run_id, plan) for run_id, plan in plans.items()))
    figures.dead_letters = [
        f"{n.letter.service} {n.letter.subject}: {n.letter.reason}"
        for n in await client.letters()
        if n.seq not in earlier
    ]
    figures.seconds = time.monotonic() - started
    return figures


async def ask_escalations(client: Client, within: float = 30.0) -> None:
    """The queue, asked again while nobody answers in time (a loaded machine, a replica starting)."""
    deadline = time.monotonic() + within
    while True:
        try:
            await client.escalations()
            return
        except (NoRespondersError, NatsTimeoutError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.3)


@pytest.fixture
async def headers_seen(fleet_client: Client) -> AsyncIterator[Counter[tuple[str, str]]]:
    """(service, version) of every message published on ``lw.v1.>`` while the test runs."""
    seen: Counter[tuple[str, str]] = Counter()

    async def note(msg: Msg) -> None:
        h = msg.headers or {}
        if VERSION_HEADER in h:
            seen[(h.get(SERVICE_HEADER, "?"), h[VERSION_HEADER])] += 1

    sub = await fleet_client.bus.nc.subscribe("lw.v1.>", cb=note)
    yield seen
    await sub.unsubscribe()


async def span_versions(collector: OtlpCollector, want: set[str], within: float = 10.0) -> dict[str, set[str]]:
    """service -> the ``service.version`` values of its spans, once every service shows all of ``want``."""
    deadline = time.monotonic() + within
    while True:
        found: dict[str, set[str]] = {s: set() for s in SERVICES}
        for span in list(collector.spans):
            service = span.service.removeprefix("loopwarden-")
            if service in found:
                found[service].add(str(span.resource.get("service.version")))
        if all(want <= v for v in found.values()) or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.3)


def check(figures: Figures, fleet: Fleet, seen: Counter[tuple[str, str]], spans: dict[str, set[str]]) -> None:
    summary = figures.report()
    print("\n" + summary)
    print(f"  message headers (service, version): {dict(sorted(seen.items()))}")
    print(f"  span versions: { {s: sorted(v) for s, v in spans.items()} }")
    assert figures.replacements == len(SERVICES) * (1 if "rounds" not in figures.direction else 2), summary
    assert figures.lost == [] and figures.doubled == {} and figures.unfinished == {}, summary
    assert figures.dead_letters == [], summary
    assert figures.completed == figures.runs, summary
    assert all(n > 0 for n in figures.in_flight), f"a replica was stopped with no run in flight: {summary}"
    for service in PUBLISHING:  # the old code really ran: it sent its own version
        assert seen[(service, OLD)] > 0 and seen[(service, NEW)] > 0, (service, dict(seen))
    for service, versions in spans.items():  # each replica's version is in the trace
        assert {OLD, NEW} <= versions, (service, spans)


@pytest.mark.timeout(bound(300))  # a loaded machine: each replacement is mostly a start-up
async def test_each_service_upgraded_in_turn_under_load_loses_and_doubles_no_run(
    fleet: Fleet, fleet_client: Client, collector: OtlpCollector, headers_seen: Counter[tuple[str, str]]
) -> None:
    await fleet_at(fleet, OLD)
    collector.spans.clear()
    figures = await roll(fleet, fleet_client, NEW)
    check(figures, fleet, headers_seen, await span_versions(collector, {OLD, NEW}))
    assert {r.version for r in fleet.current.values()} == {NEW}


@pytest.mark.timeout(bound(300))
async def test_each_service_rolled_back_in_turn_under_load_loses_and_doubles_no_run(
    fleet: Fleet, fleet_client: Client, collector: OtlpCollector, headers_seen: Counter[tuple[str, str]]
) -> None:
    await fleet_at(fleet, NEW)
    collector.spans.clear()
    figures = await roll(fleet, fleet_client, OLD)
    check(figures, fleet, headers_seen, await span_versions(collector, {OLD, NEW}))
    assert {r.version for r in fleet.current.values()} == {OLD}


@pytest.mark.slow
@pytest.mark.timeout(bound(1200))
@pytest.mark.skipif(
    not os.environ.get("LW_LONG_UPGRADE"), reason="the long form: LW_LONG_UPGRADE=1 (see the docstring)"
)
async def test_long_form_upgrades_and_rollbacks_back_and_forth_under_heavier_load(
    fleet: Fleet, fleet_client: Client, collector: OtlpCollector, headers_seen: Counter[tuple[str, str]]
) -> None:
    await fleet_at(fleet, OLD)
    collector.spans.clear()
    figures = await roll(fleet, fleet_client, NEW, rounds=2, every=0.35, warmup=3)
    check(figures, fleet, headers_seen, await span_versions(collector, {OLD, NEW}))


async def fleet_at(fleet: Fleet, version: str) -> None:
    """Every service at ``version`` (a test that failed half-way leaves a mixed fleet)."""
    for service, replica in list(fleet.current.items()):
        if replica.version != version:
            await fleet.replace(service, version)
    await fleet.settled()
