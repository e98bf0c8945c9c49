"""Escalation app: settings -> telemetry -> bus -> queue handlers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from faststream.nats import NatsRouter

from services.escalation.handlers import EscalationQueue
from shared.bus import Bus
from shared.settings import Settings
from shared.telemetry import Telemetry


def build(bus: Bus, settings: Settings, telemetry: Telemetry, router: NatsRouter) -> Callable[[], Awaitable[None]] | None:
    EscalationQueue(bus, telemetry).register(router)
    return None
