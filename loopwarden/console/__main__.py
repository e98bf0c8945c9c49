"""`python -m loopwarden.console` runs the operator console (uvicorn on LW_CONSOLE_HOST:LW_CONSOLE_PORT)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

import uvicorn

from loopwarden.client import Client
from loopwarden.console.app import create_app
from shared.service import configure_logging, run
from shared.settings import Settings, load_settings
from shared.telemetry import setup_telemetry

log = logging.getLogger("loopwarden.console")


async def serve(settings: Settings) -> None:
    configure_logging(settings.log_level)
    if not settings.console_users and settings.console_passwords_file:
        from loopwarden.console.local import generated_users
        from shared.permissions import OPERATORS

        users = generated_users(Path(settings.console_passwords_file), list(OPERATORS))
        settings = settings.model_copy(update={"console_users": users})
        log.warning("operator passwords for this console are in %s", settings.console_passwords_file)
    if not settings.console_users:
        log.warning("LW_CONSOLE_USERS is not set: nobody can log in to the console")
    telemetry = setup_telemetry("console", settings, prometheus=True)  # /metrics beside /healthz
    async with Client(settings, telemetry=telemetry, identity="console") as client:
        app, console = create_app(settings, client)
        console.observed(telemetry)
        await console.live.start()
        config = uvicorn.Config(
            app,
            host=settings.console_host,
            port=settings.console_port,
            log_level="warning",
            lifespan="off",
            timeout_graceful_shutdown=2,  # a run page's open event stream does not hold the shutdown
        )
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():  # noqa: ASYNC110 - uvicorn exposes a flag, not an event
            await asyncio.sleep(0.05)
        if task.done():
            task.result()  # the port is taken, or similar: say so and stop
            raise SystemExit(f"console: could not listen on {settings.console_host}:{settings.console_port}")
        port = server.servers[0].sockets[0].getsockname()[1] if server.servers else settings.console_port
        log.info("console on http://%s:%d", settings.console_host, port)
        print(f"loopwarden-console ready on http://{settings.console_host}:{port}", flush=True)
        lost = asyncio.create_task(client.bus.closed_for_good.wait())  # nats-py will not reconnect
        try:
            await asyncio.wait({task, lost}, return_when=asyncio.FIRST_COMPLETED)
            if lost.done() and not task.done():  # /healthz says so meanwhile; exit non-zero to be restarted
                server.should_exit = True
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(5):
                        await task
                raise SystemExit("console: the NATS connection was closed for good; exiting to be restarted")
            task.result()
        finally:
            lost.cancel()
            await console.live.stop()
            telemetry.shutdown()


def main() -> None:
    settings = load_settings("console")
    run(serve(settings), settings)


if __name__ == "__main__":
    main()
