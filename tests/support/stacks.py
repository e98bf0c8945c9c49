"""What the test stacks are made of: the environment every stack runs with, the services each kind of
stack starts, and the helpers a fixture starts and stops one with. The fixtures themselves live in
``tests/stack/conftest.py`` (the session stack and its kin), ``tests/locked/conftest.py`` (``locked``) or in the
module of ``tests/own/`` that needs a stack of its own."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest

from loopwarden.stack import LocalStack
from shared.settings import Settings
from tests.support.timing import bound

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
    "LW_TENANT_DAILY_CEILING_USD": "0.05",  # every tenant's (tests/stack/test_cost.py) but the default one's:
    "LW_TENANT_CEILINGS": '{"default": 1000}',  # runs submitted without a tenant are the default tenant's
    "LW_METRICS_POLL_S": "5",  # the JetStream figures on /metrics (tests/stack/test_prometheus_scrape.py)
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


def settings_for(stack: LocalStack, **overrides: Any) -> Settings:
    return Settings(nats_url=stack.nats_url, **overrides)


def running(stack: LocalStack) -> Iterator[LocalStack]:
    """A fixture's stack, started, and stopped when the fixture ends."""
    try:
        stack.start()
        yield stack
    finally:
        stack.stop()


def own_stack(tmp_path_factory: pytest.TempPathFactory, name: str, services: tuple[str, ...]) -> Iterator[LocalStack]:
    return running(LocalStack(state_dir=tmp_path_factory.mktemp(name), env=TEST_ENV, services=services))
