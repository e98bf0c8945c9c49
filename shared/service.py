"""Running a service process: settings -> logging -> telemetry -> bus -> handlers -> serve.

Every ``python -m services.<name>`` goes through ``serve`` so that start-up, signal
handling and shutdown are the same for all six.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import uvloop

from shared import gc_policy, opcounts
from shared import metrics as M
from shared.bus import Bus
from shared.health import HealthServer
from shared.jetstream_gauges import JetStreamGauges, reported_streams
from shared.replica_registry import Registration
from shared.settings import Settings, load_settings
from shared.telemetry import Telemetry, setup_telemetry
from shared.urls import redact_url

# The services that count tokens before a model call (the planner's turns, the judge's scoring): ``warm_up``.
COUNTS_TOKENS = frozenset({"planner", "judge"})

# build(bus, settings, telemetry) registers handlers and returns an optional
# coroutine factory run once the broker is connected (e.g. registering tool contracts).
AfterConnect = Callable[[], Awaitable[None]] | None
Build = Callable[[Bus, Settings, Telemetry], AfterConnect]


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("faststream", "nats", "httpx", "httpx2", "anthropic"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLevelName(level)))


def warm_up(service: str) -> None:
    """Load now what the services that count a model call's tokens would otherwise load in their first run's first
    turn: the tokenizer's BPE table (~0.15 s; each replica started, e.g. by a rolling upgrade, made a run wait)."""
    if service in COUNTS_TOKENS:
        from shared import tokens

        tokens.encoding()


async def serve(service: str, build: Build, settings: Settings | None = None) -> None:
    settings = settings or load_settings(service)
    configure_logging(settings.log_level)
    telemetry = setup_telemetry(service, settings)
    bus = Bus(settings, service, telemetry.bus_tracer_provider, telemetry.meter_provider)
    after_connect = build(bus, settings, telemetry)
    registration = Registration(bus, service)  # this replica in lw_replicas while it runs (shared/replicas.py)
    warm_up(service)
    gc.collect()
    gc.freeze()  # the modules, settings and handlers built so far: never garbage, out of every later collection
    gc_policy.set_thresholds()  # services/__init__.py set them already, unless served from elsewhere (a bench)
    stop = asyncio.Event()
    started = asyncio.Event()

    def ready() -> tuple[bool, str]:
        if not started.is_set():
            return False, "starting: connecting to NATS and creating consumers"
        try:
            connected = bus.nc.is_connected
        except Exception:
            connected = False
        if not connected:
            return False, "NATS connection lost; reconnecting"
        missing = bus.missing_consumers()
        return (False, "; ".join(missing)) if missing else (True, "connected and consuming")

    health = None
    if settings.health_port is not None:  # before connecting: liveness answers while start-up waits
        health = HealthServer(
            service, ready, settings.health_host, settings.health_port, metrics=telemetry.prometheus_text
        )
        await health.start()
    M.computed_gauge(
        telemetry.meter("loopwarden.service"),
        M.SERVICE_READY,
        lambda: [({}, 1.0 if ready()[0] else 0.0)],
        description="1 while the service is connected to NATS and consuming (/readyz answers 200), else 0",
    )
    # backlog of this service's durables and the store of its streams, polled in the background (/metrics)
    gauges = JetStreamGauges(
        lambda: bus.js,
        lambda: bus.consumer_specs,
        reported_streams(service),
        telemetry.meter("loopwarden.jetstream"),
        settings.metrics_poll_s,
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    if settings.op_counts_dir:  # a benchmark reads what this process sent, by kind (shared/opcounts.py)
        counts_dir = settings.op_counts_dir
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signal.SIGUSR1, lambda: opcounts.dump(counts_dir, service))

    async def startup() -> None:
        await bus.connect()
        if after_connect is not None:
            await after_connect()
        await bus.start()
        registration.start()
        if telemetry.registry is not None or settings.otel_exporter_otlp_endpoint:  # someone reads them
            gauges.start()
        logging.getLogger("loopwarden").info("%s ready on %s", service, redact_url(settings.nats_url))
        started.set()
        print(f"loopwarden-{service} ready", flush=True)

    # A stop signal must win even while start-up is stuck (e.g. reconnecting to a server
    # that died with the same Ctrl-C).
    starting = asyncio.create_task(startup())
    stopping = asyncio.create_task(stop.wait())
    lost = asyncio.create_task(bus.closed_for_good.wait())  # NATS closed the connection: nats-py won't reconnect
    try:
        await asyncio.wait({starting, stopping, lost}, return_when=asyncio.FIRST_COMPLETED)
        if starting.done() and not lost.done():
            starting.result()  # start-up errors surface here
            await asyncio.wait({stopping, lost}, return_when=asyncio.FIRST_COMPLETED)
        if lost.done():  # exit non-zero, so a supervisor starts it again (``ready`` says not ready meanwhile)
            starting.cancel()
            raise SystemExit(f"{service}: the NATS connection was closed for good; exiting to be restarted")
        if not starting.done():
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await starting
    finally:
        stopping.cancel()
        lost.cancel()
        await registration.stop()  # gone from the registry at once: runs that need this service see it
        await gauges.stop()
        try:
            async with asyncio.timeout(settings.ack_wait_s + 5):
                await bus.stop()  # drains in-flight handlers; unacked messages go to a peer
        except (TimeoutError, Exception):
            logging.getLogger("loopwarden").warning("%s: shutdown did not drain cleanly", service)
        telemetry.shutdown()
        if health is not None:
            await health.stop()


def run(main: Coroutine[Any, Any, None], settings: Settings) -> None:
    """Run a service's main coroutine on the configured event loop (``LW_EVENT_LOOP``): uvloop by
    default, which spends less CPU per message than the standard loop (``make bench``, throughput)."""
    with contextlib.suppress(KeyboardInterrupt):
        if settings.event_loop == "uvloop":
            uvloop.run(main)
        else:
            asyncio.run(main)


def main(service: str, build: Build) -> None:
    settings = load_settings(service)
    run(serve(service, build, settings), settings)
