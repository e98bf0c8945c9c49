"""Validator app: settings -> telemetry -> bus -> handler."""

from __future__ import annotations

from services.validator.handlers import Validator
from shared.bus import Bus
from shared.service import AfterConnect
from shared.settings import Settings
from shared.telemetry import Telemetry


def build(bus: Bus, settings: Settings, telemetry: Telemetry) -> AfterConnect:
    Validator(bus, telemetry).register()
    return None
