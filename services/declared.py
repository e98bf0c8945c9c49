"""What each service declares: the durable consumers it consumes from and the subjects it answers, found the one
way there is - its own ``build`` run against a bus that never connects, read back with ``shared.bus.declarations``.

Bootstrap (``loopwarden/infra.py``) creates the durables from it, the AsyncAPI generator
(``loopwarden/generate/asyncapi.py``) documents it, ``auth.conf`` grants the executor a durable per tool of
``hosted_tools`` and ``tests/repo/test_channel_subscribers.py`` holds the channel table's subscriber column against it.
This module stands above every worker (it imports their builds); no worker imports it.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.escalation.app import build as escalation
from services.executor.app import build as executor
from services.executor.app import load_registry
from services.executor.handlers import Executor
from services.executor.registry import ToolRegistry
from services.governor.app import build as governor
from services.judge.app import build as judge
from services.planner.app import build as planner
from services.validator.app import build as validator
from shared.bus import Bus, ConsumerSpec, Declaration, declarations
from shared.channels import SERVICES
from shared.service import Build
from shared.settings import Settings
from shared.telemetry import setup_telemetry

BUILDS: dict[str, Build] = {
    "planner": planner,
    "executor": executor,
    "validator": validator,
    "judge": judge,
    "governor": governor,
    "escalation": escalation,
}
if tuple(BUILDS) != SERVICES:  # the channel table's service list is the one list
    raise RuntimeError(f"services.declared.BUILDS {tuple(BUILDS)} is not shared.channels.SERVICES {SERVICES}")


@dataclass(frozen=True)
class Declared:
    """Every service's declarations, in ``SERVICES`` order, each in the order the service registered them."""

    services: dict[str, tuple[Declaration, ...]]

    def of(self, service: str) -> tuple[Declaration, ...]:
        return self.services[service]

    @property
    def all(self) -> list[Declaration]:
        return [d for found in self.services.values() for d in found]

    @property
    def consumers(self) -> list[ConsumerSpec]:
        """Every durable consumer, once (what bootstrap creates)."""
        return list(dict.fromkeys(d.consumer for d in self.all if d.consumer is not None))


def hosted_tools(settings: Settings) -> list[str]:
    """The tools the executor's registry holds with ``settings`` (each gets its own durable and grant)."""
    return sorted(load_registry(settings).tools)


def _declare(service: str, settings: Settings, registry: ToolRegistry) -> tuple[Declaration, ...]:
    telemetry = setup_telemetry(service, settings)  # no exporter: nothing is sent
    bus = Bus(settings, service)
    try:
        if service == "executor":  # the registry as loaded and mounted once by the caller (module problems kept)
            Executor(bus, settings, telemetry, registry).register()
        else:
            BUILDS[service](bus, settings, telemetry)
    finally:
        telemetry.shutdown()
    return tuple(declarations(bus))


async def declared(settings: Settings, services: tuple[str, ...] = SERVICES) -> Declared:
    """What ``services`` declare with ``settings``. The executor's come from the tool registry
    (``LW_TOOL_CONTRACT_DIR``, ``LW_TOOL_MODULES``, ``LW_EXECUTOR_TOOLS``) and the MCP servers it would mount."""
    quiet = settings.model_copy(update={"otel_exporter_otlp_endpoint": None})
    registry = load_registry(quiet)
    mounts = []
    if quiet.mcp_server_specs and "executor" in services:
        from services.executor.mcp_tools import mount_mcp_servers

        mounts = await mount_mcp_servers(registry, quiet.mcp_server_specs)
    try:
        return Declared({s: _declare(s, quiet, registry) for s in services})
    finally:
        for mount in mounts:
            await mount.close()
