"""Escalation app: settings -> telemetry -> bus -> queue handlers (cache loaded before serving)."""

from __future__ import annotations

from services.escalation.handlers import EscalationQueue
from shared.bus import Bus
from shared.service import AfterConnect
from shared.settings import Settings
from shared.telemetry import Telemetry


def build(bus: Bus, settings: Settings, telemetry: Telemetry) -> AfterConnect:
    queue = EscalationQueue(bus, telemetry, settings)
    queue.register()
    return queue.start
