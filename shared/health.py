"""Health of one service process: a tiny HTTP endpoint, and the check that asks it.

With ``LW_HEALTH_PORT`` set, every ``python -m services.<name>`` serves (before it connects):

* ``GET /livez``  - 200 while the process's event loop answers (a hung loop never does);
* ``GET /readyz`` - 200 once it is connected to NATS and consuming, 503 before and while the
  connection is lost (the body says why);
* ``GET /metrics`` - its metrics in the Prometheus text format (``shared/telemetry.py``; what each
  means: docs/observability.md);

the first two with a small JSON body naming the service and its release (``version``). Kubernetes probes
call them with ``httpGet``; the compose health checks (the image has no curl) run
``python -m shared.health [--live] [--port N] [--url URL]``, which exits 0 when the endpoint
answers 200 and 1 otherwise, printing the answer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Callable

from shared.version import package_version

log = logging.getLogger("loopwarden.health")
Readiness = Callable[[], tuple[bool, str]]
Metrics = Callable[[], bytes]  # the Prometheus text of the process's metrics
MAX_REQUEST = 8192
JSON = "application/json"
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class HealthServer:
    """``/livez``, ``/readyz`` and ``/metrics`` on ``host:port`` for one process (asyncio, no framework)."""

    def __init__(
        self, service: str, ready: Readiness, host: str = "127.0.0.1", port: int = 0, metrics: Metrics | None = None
    ) -> None:
        self.service, self.ready, self.host, self.port, self.metrics = service, ready, host, port, metrics
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        try:
            self._server = await asyncio.start_server(self._handle, self.host, self.port)
        except OSError as err:  # bad config stops the service at start, naming the setting
            raise SystemExit(
                f"{self.service}: invalid setting LW_HEALTH_PORT: cannot listen on {self.host}:{self.port}: {err}"
            ) from None
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("%s: health on http://%s:%d/readyz", self.service, self.host, self.port)
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    def answer(self, path: str) -> tuple[int, dict[str, object]]:
        if path == "/livez":
            return 200, {"service": self.service, "version": package_version(), "live": True}
        if path == "/readyz":
            try:
                ok, detail = self.ready()
            except Exception as err:  # a readiness check must answer, not crash the endpoint
                ok, detail = False, f"readiness check failed: {err!r}"
            body = {"service": self.service, "version": package_version(), "ready": ok, "detail": detail}
            return (200 if ok else 503), body
        return 404, {"error": f"no such endpoint {path}; try /livez, /readyz or /metrics"}

    def respond(self, path: str) -> tuple[int, bytes, str]:
        """(status, body, content type) of ``GET path``."""
        if path == "/metrics" and self.metrics is not None:
            try:
                return 200, self.metrics(), METRICS_CONTENT_TYPE
            except Exception as err:  # a collection that fails says so; it never takes the endpoint down
                log.exception("%s: collecting the metrics failed", self.service)
                return 500, json.dumps({"error": f"collecting the metrics failed: {err!r}"}).encode(), JSON
        status, body = self.answer(path)
        return status, json.dumps(body).encode(), JSON

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            parts = head[:MAX_REQUEST].split(b"\r\n", 1)[0].decode("latin-1").split()
            method, path = (parts[0], parts[1].split("?", 1)[0]) if len(parts) >= 2 else ("", "")
            if method not in ("GET", "HEAD"):
                status, data, content_type = 405, json.dumps({"error": "GET only"}).encode(), JSON
            else:
                status, data, content_type = self.respond(path)
            reason = {
                200: "OK",
                404: "Not Found",
                405: "Method Not Allowed",
                500: "Internal Server Error",
                503: "Service Unavailable",
            }[status]
            writer.write(
                f"HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\n"
                f"content-length: {len(data)}\r\nconnection: close\r\n\r\n".encode()
                + (data if method != "HEAD" else b"")
            )
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


def check(url: str, timeout: float = 3.0) -> tuple[bool, str]:
    """Ask a health endpoint: (answered 200, what it said)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status == 200, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as err:
        return False, err.read().decode(errors="replace") or f"HTTP {err.code}"
    except (OSError, ValueError) as err:
        return False, f"{url}: {err}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m shared.health",
        description="Exit 0 when this container's service is ready (or live with --live), 1 otherwise.",
    )
    parser.add_argument("--live", action="store_true", help="ask /livez (the process answers) instead of /readyz")
    parser.add_argument("--port", type=int, default=None, help="the service's LW_HEALTH_PORT (default: from env)")
    parser.add_argument("--url", default=None, help="ask this URL instead (e.g. the console's /healthz)")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the answer")
    args = parser.parse_args(argv)
    url = args.url
    if url is None:
        port = args.port if args.port is not None else os.environ.get("LW_HEALTH_PORT")
        if not port:
            print("no health port: pass --port or set LW_HEALTH_PORT", file=sys.stderr)
            return 2
        url = f"http://127.0.0.1:{port}/{'livez' if args.live else 'readyz'}"
    ok, said = check(url, args.timeout)
    print(said.strip())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
