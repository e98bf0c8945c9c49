"""Managed infrastructure: what ``loopwarden bootstrap`` (the admin) puts in place.

With ``LW_MANAGE_STREAMS=false`` services and clients create and change nothing on the
server; the operator runs bootstrap once (and again after changing a replica count, an
ack wait or the hosted tools). It creates or updates the streams and buckets with the
configured replica counts and every service's durable consumers, built from the same
``shared.bus.consumer_config`` the services check at start.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from shared.bus import Bus, ConsumerSpec, ensure_buckets, ensure_consumers, ensure_streams, until_ready
from shared.settings import Settings
from shared.telemetry import setup_telemetry

log = logging.getLogger("loopwarden.bootstrap")


@dataclass
class BootstrapReport:
    changed: list[str] = field(default_factory=list)
    consumers: list[ConsumerSpec] = field(default_factory=list)


async def declared_consumers(settings: Settings) -> list[ConsumerSpec]:
    """Every service's durable consumers, as the services declare them (their own handlers
    are registered on a bus that never connects). The executor's come from the tool registry
    (``LW_TOOL_CONTRACT_DIR``, ``LW_EXECUTOR_TOOLS``) and the MCP servers it would mount."""
    from services.escalation.app import build as escalation
    from services.executor.app import load_registry
    from services.executor.handlers import Executor
    from services.governor.app import build as governor
    from services.judge.app import build as judge
    from services.planner.app import build as planner
    from services.validator.app import build as validator

    quiet = settings.model_copy(update={"otel_exporter_otlp_endpoint": None})
    specs: list[ConsumerSpec] = []
    for name, build in (
        ("planner", planner),
        ("validator", validator),
        ("judge", judge),
        ("governor", governor),
        ("escalation", escalation),
    ):
        bus = Bus(quiet, name)
        build(bus, quiet, setup_telemetry(name, quiet))
        specs += bus.consumer_specs
    bus = Bus(quiet, "executor")
    registry = load_registry(quiet)
    mounts = []
    if quiet.mcp_server_specs:
        from services.executor.mcp_tools import mount_mcp_servers

        mounts = await mount_mcp_servers(registry, quiet.mcp_server_specs)
    try:
        Executor(bus, quiet, setup_telemetry("executor", quiet), registry).register()
    finally:
        for mount in mounts:
            await mount.close()
    specs += bus.consumer_specs
    return list(dict.fromkeys(specs))


async def bootstrap(settings: Settings) -> BootstrapReport:
    """Create or update streams, buckets and durable consumers to the declared settings."""
    report = BootstrapReport(consumers=await declared_consumers(settings))
    bus = Bus(settings, "admin")
    await bus.broker.connect()
    try:
        js = bus.js
        report.changed += await until_ready("admin", "JetStream", lambda: ensure_streams(js, settings, update=True))
        report.changed += await until_ready("admin", "JetStream", lambda: ensure_buckets(js, settings, update=True))
        report.changed += await until_ready(
            "admin", "JetStream", lambda: ensure_consumers(js, settings, report.consumers)
        )
    finally:
        await bus.broker.stop()
    for line in report.changed:
        log.info("bootstrap: %s", line)
    return report
