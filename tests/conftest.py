"""Session fixtures: a real nats-server with JetStream and every service as its own process.

The stack runs two planner and two executor replicas (shared durable consumers, CAS on
run state), exports spans to an in-test OTLP receiver, and points the anthropic provider
at an in-test Messages API server: runs submitted with a scenario are replayed by the
scripted provider, runs submitted without one go through the real Anthropic SDK.

Fixtures and pytest hooks only: the helpers test modules import live in ``tests/support/`` (stacks.py,
runs.py, paths.py), and a module imports nothing from here (``tests/unit/test_suite_shape.py``).
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator

import pytest

from loopwarden.client import Client
from loopwarden.fake_model import FakeModel
from loopwarden.stack import LocalStack, tail
from shared.settings import Settings
from shared.telemetry import Telemetry, setup_telemetry
from tests.support import stragglers
from tests.support.locked import Deployment, locked_deployment
from tests.support.otlp_collector import OtlpCollector
from tests.support.stacks import MCP_ORDERS, ONE_EACH, REPLICAS, TEST_ENV, own_stack, running, settings_for
from tests.support.stragglers import pytest_sessionfinish, pytest_terminal_summary  # noqa: F401 (hooks)
from tests.support.timing import bound, scale_test_timeout


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


@pytest.fixture
async def client(stack: LocalStack, client_telemetry: Telemetry) -> AsyncIterator[Client]:
    async with Client(settings_for(stack), telemetry=client_telemetry) as c:
        yield c


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        # whichever stack the test used, the session's or its module's own (each named for what it starts)
        funcargs: dict[str, object] = getattr(item, "funcargs", {})
        for st in (v for v in funcargs.values() if isinstance(v, LocalStack)):
            logs = "\n".join(tail(p.log, 25) for p in st.procs)
            report.sections.append(("service logs (tail)", logs))


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
