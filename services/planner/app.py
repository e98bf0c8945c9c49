"""Planner app: settings -> telemetry -> bus -> handlers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from faststream.nats import NatsRouter

from services.planner.handlers import Planner
from shared.bus import Bus
from shared.settings import Settings
from shared.telemetry import Telemetry


def build(bus: Bus, settings: Settings, telemetry: Telemetry, router: NatsRouter) -> Callable[[], Awaitable[None]] | None:
    Planner(bus, settings, telemetry).register(router)
    return None
