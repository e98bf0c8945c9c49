"""Executor app: settings -> telemetry -> tool registry -> bus -> one consumer per hosted tool."""

from __future__ import annotations

import logging
from pathlib import Path

import services.executor.tools.demo  # noqa: F401  - registers the @tool-declared demo tools
from services.executor.handlers import Executor
from services.executor.registry import DECLARED, SCHEMAS_DIR, ToolRegistry
from shared.bus import Bus
from shared.service import AfterConnect
from shared.settings import Settings
from shared.telemetry import Telemetry

log = logging.getLogger("loopwarden.executor")


def load_registry(settings: Settings) -> ToolRegistry:
    registry = ToolRegistry(default_dialect=settings.default_schema_dialect, boundaries=dict(settings.boundaries))
    registry.load_declared(DECLARED)
    registry.load_json_dir(SCHEMAS_DIR)
    if settings.tool_contract_dir:
        registry.load_json_dir(Path(settings.tool_contract_dir))
    return registry  # MCP tools are mounted once connected (Executor.start)


def build(bus: Bus, settings: Settings, telemetry: Telemetry) -> AfterConnect:
    registry = load_registry(settings)
    executor = Executor(bus, settings, telemetry, registry)
    executor.register()
    log.info("hosting tools: %s", ", ".join(sorted(registry.hosted(settings.hosted_tools))))
    return executor.start
