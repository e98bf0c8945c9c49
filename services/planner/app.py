"""Planner app: settings -> telemetry -> bus -> handlers."""

from __future__ import annotations

import gc

from services.planner.handlers import Planner
from shared.bus import Bus
from shared.service import AfterConnect
from shared.settings import Settings
from shared.telemetry import Telemetry

# The planner keeps many runs' states, messages and token/render memos alive: with the default
# thresholds the cyclic GC walked them all over and over (measured on a loaded box: ~1.8 s in full
# collections in a planner that used ~4.5 s of CPU for a 64-run benchmark). What exists at start
# is never garbage; a young generation of 10k allocations lets a step's short-lived objects die by
# refcount first.
GC_THRESHOLDS = (10_000, 20, 10)


def build(bus: Bus, settings: Settings, telemetry: Telemetry) -> AfterConnect:
    Planner(bus, settings, telemetry).register()
    gc.collect()
    gc.freeze()  # the modules, settings and handlers built so far: out of every later collection
    gc.set_threshold(*GC_THRESHOLDS)
    return None
