"""Governor app: settings -> telemetry -> bus -> request/reply handler."""

from __future__ import annotations

from services.governor.handlers import Governor
from shared.bus import Bus
from shared.service import AfterConnect
from shared.settings import Settings
from shared.telemetry import Telemetry


def build(bus: Bus, settings: Settings, telemetry: Telemetry) -> AfterConnect:
    Governor(bus, settings, telemetry).register()
    return None
