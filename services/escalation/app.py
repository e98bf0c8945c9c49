"""Escalation app: settings -> telemetry -> bus -> queue handlers (cache loaded before serving)."""

from __future__ import annotations

from faststream.nats import NatsRouter

from services.escalation.handlers import EscalationQueue
from shared.bus import Bus
from shared.service import AfterConnect
from shared.settings import Settings
from shared.telemetry import Telemetry


def build(bus: Bus, settings: Settings, telemetry: Telemetry, router: NatsRouter) -> AfterConnect:
    queue = EscalationQueue(bus, telemetry, settings)
    queue.register(router)
    return queue.start
