"""What the console's responses promise the browser, and which posts it takes (pure: no HTTP objects).

Every id a URL carries is matched against its pattern before anything uses it (``bad_path_id``).
A form that changes something is taken only from the console's own pages: the browser's ``Origin``
(or, when a browser sends none, the ``Referer``) must be the console's own origin, and the form must
carry the session's token. Pages run only the console's own nonce'd script and style, may not be framed,
and are not sniffed into another type.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from shared.messages import ESCALATION_ID_PATTERN, RUN_ID_PATTERN


def own_origin(scheme: str, host: str, public_url: str | None) -> str:
    """The origin the console's pages are served from: the configured public address when behind a
    proxy, else the request's own scheme and Host."""
    if public_url:
        parts = urlsplit(public_url)
        return f"{parts.scheme}://{parts.netloc}".lower()
    return f"{scheme}://{host}".lower()


def origin_refusal(origin: str | None, referer: str | None, own: str) -> str | None:
    """Why a state-changing request is refused, or None when it comes from the console's own pages."""
    if origin is not None:
        if origin.lower() != own:
            return f"refused: a form from {origin[:100]!r} may not act on this console"
        return None
    if referer:
        parts = urlsplit(referer)
        if f"{parts.scheme}://{parts.netloc}".lower() != own:
            return "refused: a form from another site may not act on this console"
        return None
    return "refused: the request does not say which page it came from (no Origin or Referer)"


def content_security_policy(nonce: str) -> str:
    return "; ".join(
        (
            "default-src 'none'",
            f"script-src 'nonce-{nonce}'",
            f"style-src 'nonce-{nonce}'",
            "connect-src 'self'",  # the live fragments
            "img-src 'self'",
            "form-action 'self'",
            "frame-ancestors 'none'",
            "base-uri 'none'",
        )
    )


def security_headers(nonce: str) -> dict[str, str]:
    return {
        "Content-Security-Policy": content_security_policy(nonce),
        "X-Frame-Options": "DENY",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "same-origin",
        "Cache-Control": "no-store",
    }


# Every id a URL carries is matched before it reaches a subject, a key or a file (anything else: 404): an
# over-long one would pass nats-server's control line, which closes the console's connection for good.
PATH_IDS = {
    "run_id": re.compile(RUN_ID_PATTERN),
    "replay_id": re.compile(RUN_ID_PATTERN),
    "escalation_id": re.compile(ESCALATION_ID_PATTERN),
    "step_id": re.compile(r"^[A-Za-z0-9_.:=/-]{1,600}$"),
    "verb": re.compile(r"^[a-z]{1,16}$"),
}


def bad_path_id(params: dict[str, Any]) -> str | None:
    """The first path parameter that is not an id of its kind (None: all are)."""
    for name, value in params.items():
        pattern = PATH_IDS.get(name)
        if pattern is None or not isinstance(value, str) or pattern.fullmatch(value) is None:
            return name
    return None
