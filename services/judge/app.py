"""Judge app: settings -> telemetry -> bus -> handler. Provider and model are the judge's own."""

from __future__ import annotations

from faststream.nats import NatsRouter

from services.judge.handlers import Judge
from shared.bus import Bus
from shared.service import AfterConnect
from shared.settings import Settings
from shared.telemetry import Telemetry


def build(bus: Bus, settings: Settings, telemetry: Telemetry, router: NatsRouter) -> AfterConnect:
    Judge(bus, settings, telemetry).register(router)
    return None
