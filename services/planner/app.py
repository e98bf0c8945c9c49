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

    async def after_connect() -> None:
        planner.watch.start()  # the sweep for runs waiting on a service with no live replica
        await planner.flow.start()  # admission to the fleet: the admitter and its sweep

    return after_connect
