"""The session stack: a real nats-server with JetStream and every service as its own process, started once per
xdist worker for the modules of this folder.

The stack runs two planner and two executor replicas (shared durable consumers, CAS on run state), exports spans
to the in-test OTLP receiver, and points the anthropic provider at the in-test Messages API server
(``tests/conftest.py``): runs submitted with a scenario are replayed by the scripted provider, runs submitted
without one go through the real Anthropic SDK. Its kin, ``one_each`` and ``no_planner``, start one replica of each
service once per module that asks. ``stack`` and ``client`` are defined here and nowhere else
(``tests/repo/test_suite_shape.py``).
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Iterator

import pytest

from loopwarden.client import Client
from loopwarden.fake_model import FakeModel
from loopwarden.stack import LocalStack
from shared.telemetry import Telemetry
from tests.support.otlp_collector import OtlpCollector
from tests.support.stacks import MCP_ORDERS, ONE_EACH, REPLICAS, TEST_ENV, own_stack, running, settings_for


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


@pytest.fixture
async def client(stack: LocalStack, client_telemetry: Telemetry) -> AsyncIterator[Client]:
    async with Client(settings_for(stack), telemetry=client_telemetry) as c:
        yield c


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
