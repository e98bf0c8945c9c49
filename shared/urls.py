"""URLs as they may be printed: never with the credentials a user put in them.

``LW_NATS_URL``/``NATS_URL`` may carry ``user:password@`` (the NATS convention); every log line and CLI
message that names a server goes through :func:`redact_url`."""

from __future__ import annotations


def redact_url(url: str) -> str:
    """``url`` (or a comma-separated list of them, or a bare ``host:port``) without its userinfo."""
    return ",".join(_one(part) for part in url.split(","))


def _one(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    # Everything up to the last '@' goes: a password with a raw '@' or '/' is still not printed.
    return f"{scheme}{sep}{rest.rpartition('@')[2]}"
