"""Running a service process: settings -> logging -> telemetry -> bus -> handlers -> serve.

Every ``python -m services.<name>`` goes through ``serve`` so that start-up, signal
handling and shutdown are the same for all six.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Awaitable, Callable

from shared.bus import Bus
from shared.settings import Settings, load_settings
from shared.telemetry import Telemetry, setup_telemetry

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


async def serve(service: str, build: Build, settings: Settings | None = None) -> None:
    settings = settings or load_settings(service)
    configure_logging(settings.log_level)
    telemetry = setup_telemetry(service, settings)
    bus = Bus(settings, service, telemetry.bus_tracer_provider, telemetry.meter_provider)
    after_connect = build(bus, settings, telemetry)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)

    async def startup() -> None:
        await bus.connect()
        if after_connect is not None:
            await after_connect()
        await bus.start()
        logging.getLogger("loopwarden").info("%s ready on %s", service, settings.nats_url)
        print(f"loopwarden-{service} ready", flush=True)

    # A stop signal must win even while start-up is stuck (e.g. reconnecting to a server
    # that died with the same Ctrl-C).
    starting = asyncio.create_task(startup())
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if starting.done():
            starting.result()  # start-up errors surface here
            await stopping
        else:
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await starting
    finally:
        stopping.cancel()
        try:
            async with asyncio.timeout(settings.ack_wait_s + 5):
                await bus.stop()  # drains in-flight handlers; unacked messages go to a peer
        except (TimeoutError, Exception):
            logging.getLogger("loopwarden").warning("%s: shutdown did not drain cleanly", service)
        telemetry.shutdown()


def main(service: str, build: Build) -> None:
    settings = load_settings(service)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(service, build, settings))
