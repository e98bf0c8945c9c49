"""Executor app: settings -> telemetry -> tool registry -> bus -> one consumer per hosted tool."""

from __future__ import annotations

import logging
from pathlib import Path

from services.executor.handlers import Executor
from services.executor.registry import SCHEMAS_DIR, ToolRegistry
from services.executor.tool_modules import import_tool_modules
from services.executor.tools import demo
from shared.bus import Bus
from shared.service import AfterConnect
from shared.settings import Settings
from shared.telemetry import Telemetry
from shared.tools import declared_in

log = logging.getLogger("loopwarden.executor")


def load_registry(settings: Settings) -> ToolRegistry:
    """Every tool this executor can host: the demo tools, the user's tool modules (``LW_TOOL_MODULES``,
    ``loopwarden.tools`` entry points), JSON contract files. A module that cannot be imported is listed in
    ``module_problems`` (and ``refused``), never skipped silently."""
    registry = ToolRegistry(default_dialect=settings.default_schema_dialect, boundaries=dict(settings.boundaries))
    modules, problems = import_tool_modules(settings.tool_modules)
    for problem in problems:
        registry.module_problems.append(str(problem))
        registry.refused[f"module {problem.module}"] = str(problem)
    registry.load_declared(declared_in([demo, *modules]))  # what @tool left on each module's functions
    registry.load_json_dir(SCHEMAS_DIR)
    if settings.tool_contract_dir:
        registry.load_json_dir(Path(settings.tool_contract_dir))
    return registry  # MCP tools are mounted once connected (Executor.start)


def build(bus: Bus, settings: Settings, telemetry: Telemetry) -> AfterConnect:
    registry = load_registry(settings)
    if registry.module_problems:  # the user's tools would be missing: stop now, in one line, not later in a run
        raise SystemExit(f"loopwarden-executor: {registry.module_problems[0]}")
    executor = Executor(bus, settings, telemetry, registry)
    executor.register()
    log.info("hosting tools: %s", ", ".join(sorted(registry.hosted(settings.hosted_tools))))
    return executor.start
