"""Planner app: settings -> telemetry -> bus -> handlers."""

from __future__ import annotations

from services.planner.handlers import Planner
from shared.bus import Bus
from shared.service import AfterConnect
from shared.settings import Settings
from shared.telemetry import Telemetry


def build(bus: Bus, settings: Settings, telemetry: Telemetry) -> AfterConnect:
    planner = Planner(bus, settings, telemetry)
    planner.register()
    return planner.flow.start  # admission runs once the bus is connected
