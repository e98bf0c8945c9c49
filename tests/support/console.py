"""Driving the console from a test: the headless browser the browser tests launch, and plain HTTP from a
chosen loopback address (each test its own, so each meets the login throttle on its own)."""

from __future__ import annotations

import http.client
import time
from dataclasses import dataclass
from urllib.parse import urlencode, urlsplit

from tests.support.timing import bound

CHROMIUM = "/usr/bin/chromium-headless-shell"  # `make test` installs it (make browser)
CHROMIUM_FLAGS = [
    "--no-sandbox",  # we run as root
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]


@dataclass
class Answer:
    """One HTTP answer, and how long it took."""

    status: int
    headers: http.client.HTTPMessage
    body: str
    seconds: float

    def cookie(self) -> str | None:
        for value in self.headers.get_all("set-cookie") or []:
            if value.startswith("lw_console_session="):
                return value
        return None


def request(
    base: str,
    method: str,
    path: str,
    *,
    source: str = "127.0.0.1",
    form: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = bound(60.0),
) -> Answer:
    """One request, redirects not followed. A form carries the console's own Origin unless told otherwise."""
    parts = urlsplit(base)
    conn = http.client.HTTPConnection(
        parts.hostname or "127.0.0.1", parts.port, timeout=timeout, source_address=(source, 0)
    )
    sent = dict(headers or {})
    body = None
    if form is not None:
        body = urlencode(form)
        sent.setdefault("Origin", base)
        sent["Content-Type"] = "application/x-www-form-urlencoded"
    started = time.perf_counter()
    try:
        conn.request(method, path, body=body, headers=sent)
        response = conn.getresponse()
        text = response.read().decode(errors="replace")
        return Answer(response.status, response.headers, text, time.perf_counter() - started)
    finally:
        conn.close()


def login(base: str, operator: str, password: str, source: str, **kw: object) -> Answer:
    return request(base, "POST", "/login", source=source, form={"operator": operator, "password": password}, **kw)  # type: ignore[arg-type]


def session_cookie(answer: Answer) -> str:
    cookie = answer.cookie()
    assert answer.status == 303 and cookie, (answer.status, answer.body[:300])
    return cookie.split(";", 1)[0]
