"""Judge app: settings -> telemetry -> bus -> handler. Provider and model are the judge's own."""

from __future__ import annotations

from services.judge.handlers import Judge
from shared.bus import Bus
from shared.service import AfterConnect
from shared.settings import Settings
from shared.telemetry import Telemetry


def build(bus: Bus, settings: Settings, telemetry: Telemetry) -> AfterConnect:
    Judge(bus, settings, telemetry).register()
    return None
