"""What the console's responses promise the browser, and which posts it takes (pure: no HTTP objects).

A form that changes something is taken only from the console's own pages: the browser's ``Origin``
(or, when a browser sends none, the ``Referer``) must be the console's own origin, and the form must
carry the session's token. Pages run only the console's own nonce'd script and style, may not be framed,
and are not sniffed into another type.
"""

from __future__ import annotations

from urllib.parse import urlsplit


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
