"""Escalation app: settings -> telemetry -> bus -> the queue's handlers (cache loaded before serving) and the
operators' agent registrations."""

from __future__ import annotations

from services.escalation.agents import AgentRegistrations
from services.escalation.handlers import EscalationQueue
from shared.bus import Bus
from shared.service import AfterConnect
from shared.settings import Settings
from shared.telemetry import Telemetry


def build(bus: Bus, settings: Settings, telemetry: Telemetry) -> AfterConnect:
    queue = EscalationQueue(bus, telemetry, settings)
    queue.register()
    AgentRegistrations(bus).register()  # the operators' agent registrations: the roster decides
    return queue.start
