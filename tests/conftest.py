"""Session fixtures: a real nats-server with JetStream and every service as its own process.

The stack runs two planner and two executor replicas (shared durable consumers, CAS on
run state), exports spans to an in-test OTLP receiver, and points the anthropic provider
at an in-test Messages API server: runs submitted with a scenario are replayed by the
scripted provider, runs submitted without one go through the real Anthropic SDK.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from loopwarden.client import Client
from loopwarden.fake_model import FakeModel
from loopwarden.stack import LocalStack, tail
from shared.messages import Escalation, RunSnapshot
from shared.scenario import parse_scenario
from shared.settings import Settings
from shared.telemetry import Telemetry, setup_telemetry
from tests.support import stragglers
from tests.support.locked import Deployment, locked_deployment
from tests.support.otlp_collector import OtlpCollector
from tests.support.stragglers import pytest_sessionfinish, pytest_terminal_summary  # noqa: F401 (hooks)
from tests.support.timing import bound, eventually, scale_test_timeout

ROOT = Path(__file__).resolve().parents[1]
TEST_ENV = {
    "LW_ACK_WAIT_S": "3",
    "LW_TOOL_HOST_GRACE_S": f"{bound(2):g}",  # a tool no replica pulls fails after 2 s here (15 s by default)
    # a killed executor's call is taken for abandoned 4 s after its last renewal (10 s by default), on the
    # suite's time scale: a loaded machine may delay a renewal
    "LW_TOOL_LEASE_S": f"{bound(4):g}",
    "LW_MAX_DELIVER": "5",
    "LW_REDELIVER_DELAY_S": "0.2",
    "LW_MODEL_RETRY_BASE_S": "0.05",
    "LW_MODEL_RETRY_MAX_S": "0.3",
    "LW_LOG_LEVEL": "INFO",
    "ANTHROPIC_API_KEY": "test-key-not-real",
    "LW_TENANT_DAILY_CEILING_USD": "0.05",  # every tenant's (tests/test_cost.py) but the default one's:
    "LW_TENANT_CEILINGS": '{"default": 1000}',  # runs submitted without a tenant are the default tenant's
    "LW_METRICS_POLL_S": "5",  # the JetStream figures on /metrics (tests/test_prometheus_scrape.py)
    "LW_CONSOLE_PORT": "0",  # any free port: two stacks starting at once both saw 8700 free, and one console failed
}
REPLICAS = ("planner", "planner", "executor", "executor", "validator", "judge", "governor", "escalation")
ONE_EACH = ("planner", "executor", "validator", "judge", "governor", "escalation")
MCP_ORDERS = {
    "name": "orders",
    "command": [sys.executable, "-m", "services.executor.tools.mcp_orders"],
    "output_schemas": {
        "inventory_report": {
            "type": "object",
            "required": ["sku", "count"],
            "properties": {"sku": {"type": "string"}, "count": {"type": "integer", "minimum": 0}},
        }
    },
    "repairs": {"inventory_report": [{"path": "/count", "rule": "numeric_string_to_integer"}]},
}


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    stragglers.pytest_configure(config)  # a run id every process the run starts inherits
    scale_test_timeout(config)
    # every stack the run starts, in this process or a CLI's, waits for readiness on the same scale
    os.environ.setdefault("LW_STACK_READY_TIMEOUT_S", f"{bound(60):g}")


@pytest.fixture(scope="session")
def otlp() -> Iterator[OtlpCollector]:
    collector = OtlpCollector().start()
    yield collector
    collector.stop()


@pytest.fixture(scope="session")
def messages_api() -> Iterator[FakeModel]:
    server = FakeModel().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def stack(
    tmp_path_factory: pytest.TempPathFactory, otlp: OtlpCollector, messages_api: FakeModel
) -> Iterator[LocalStack]:
    env = {**TEST_ENV, "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint, "ANTHROPIC_BASE_URL": messages_api.base_url}
    yield from running(
        LocalStack(
            state_dir=tmp_path_factory.mktemp("stack"),
            nats_url=os.environ.get("LW_TEST_NATS_URL"),
            env=env,
            services=REPLICAS,
            env_per_service={"executor": {"LW_MCP_SERVERS": json.dumps([MCP_ORDERS])}},
        )
    )


@pytest.fixture(scope="session")
def locked(tmp_path_factory: pytest.TempPathFactory, messages_api: FakeModel) -> Iterator[Deployment]:
    """The locked deployment, as production runs it (``tests/support/locked.py``): every service and the console
    as its own NATS user, scripted runs off, the model the session's Messages API; people act as their users."""
    env = {**TEST_ENV, "LW_TENANT_CEILINGS": '{"default": 1000, "acme": 1000}'}
    with locked_deployment(tmp_path_factory.mktemp("locked"), env, messages_api.base_url) as deployment:
        yield deployment


@pytest.fixture(scope="session")
def client_telemetry(otlp: OtlpCollector) -> Telemetry:
    return setup_telemetry("client", Settings(otel_exporter_otlp_endpoint=otlp.endpoint))


def settings_for(stack: LocalStack, **overrides: Any) -> Settings:
    return Settings(nats_url=stack.nats_url, **overrides)


@pytest.fixture
async def client(stack: LocalStack, client_telemetry: Telemetry) -> AsyncIterator[Client]:
    async with Client(settings_for(stack), telemetry=client_telemetry) as c:
        yield c


async def run_scenario(
    client: Client,
    scenario: dict[str, Any],
    timeout: float = bound(30),
    until: tuple[str, ...] = ("completed", "stopped", "failed"),
) -> RunSnapshot:
    run_id = await client.submit_scenario(parse_scenario(scenario))
    return await client.wait(run_id, timeout=timeout, until=until)


async def escalations_of(client: Client, run_id: str, count: int = 1, timeout: float = bound(10)) -> list[Escalation]:
    """The run's open escalations, once ``count`` exist: the queue item is created by the escalation
    service from its own message, a moment after the run's state says it is waiting. Fewer after
    ``timeout``: the ones there are, for the caller's assertion to show."""
    items: list[Escalation] = []

    async def enough() -> bool:
        nonlocal items
        items = (await client.escalations(run_id=run_id)).escalations
        return len(items) >= count

    with contextlib.suppress(AssertionError):
        await eventually(enough, what=f"{count} escalation(s) of {run_id}", within=timeout)
    return items


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed and "stack" in getattr(item, "fixturenames", ()):
        st: LocalStack = item.funcargs.get("stack")  # type: ignore[attr-defined]
        if st is not None:
            logs = "\n".join(tail(p.log, 25) for p in st.procs)
            report.sections.append(("service logs (tail)", logs))


def running(stack: LocalStack) -> Iterator[LocalStack]:
    """A fixture's stack, started, and stopped when the fixture ends."""
    try:
        stack.start()
        yield stack
    finally:
        stack.stop()


def own_stack(tmp_path_factory: pytest.TempPathFactory, name: str, services: tuple[str, ...]) -> Iterator[LocalStack]:
    return running(LocalStack(state_dir=tmp_path_factory.mktemp(name), env=TEST_ENV, services=services))


@pytest.fixture(scope="module")
def one_each(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """One replica of each service, one stack per test module that asks for it."""
    yield from own_stack(tmp_path_factory, "one-each", ONE_EACH)


@pytest.fixture(scope="module")
def no_planner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """Every service but the planner, one stack per test module that asks for it: the test decides
    which planner runs (e.g. one started with ``LW_FAULT_INJECT``)."""
    yield from own_stack(tmp_path_factory, "no-planner", tuple(s for s in ONE_EACH if s != "planner"))


@pytest.fixture
async def one_client(one_each: LocalStack) -> AsyncIterator[Client]:
    async with Client(settings_for(one_each)) as c:
        yield c
