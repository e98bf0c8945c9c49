"""Judge app: settings -> telemetry -> bus -> handler. Provider and model are the judge's own."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from faststream.nats import NatsRouter

from services.judge.handlers import Judge
from shared.bus import Bus
from shared.settings import Settings
from shared.telemetry import Telemetry


def build(bus: Bus, settings: Settings, telemetry: Telemetry, router: NatsRouter) -> Callable[[], Awaitable[None]] | None:
    Judge(bus, settings, telemetry).register(router)
    return None
