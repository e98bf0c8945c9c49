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

log = logging.getLogger("loopwarden.bootstrap")


@dataclass
class BootstrapReport:
    changed: list[str] = field(default_factory=list)
    consumers: list[ConsumerSpec] = field(default_factory=list)


async def declared_consumers(settings: Settings) -> list[ConsumerSpec]:
    """Every service's durable consumers, as the services declare them (``services.declared``)."""
    from services.declared import declared

    return (await declared(settings)).consumers


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
