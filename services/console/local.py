"""Settings for a console started by the local stack (``make run`` / ``loopwarden up``): a port, and —
when ``LW_CONSOLE_USERS`` is not set — a fresh random password per operator of the roster, written
to a file in the stack's state folder (never a fixed default password)."""

from __future__ import annotations

import json
import secrets
import socket
from pathlib import Path

from services.console.auth import hash_password

DEFAULT_PORT = 8700


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def console_env(state_dir: Path, env: dict[str, str]) -> tuple[dict[str, str], str, str | None]:
    """(extra environment, console URL, path of the generated passwords file or None)."""
    from shared.permissions import OPERATORS

    extra: dict[str, str] = {}
    port = int(env.get("LW_CONSOLE_PORT") or 0)
    if not port:
        port = DEFAULT_PORT if _free(DEFAULT_PORT) else _any_port()
        extra["LW_CONSOLE_PORT"] = str(port)
    note = None
    if not env.get("LW_CONSOLE_USERS"):
        passwords = {name: secrets.token_urlsafe(9) for name in OPERATORS}
        extra["LW_CONSOLE_USERS"] = json.dumps({n: hash_password(p, rounds=10) for n, p in passwords.items()})
        path = state_dir / "console-passwords.txt"
        path.write_text("".join(f"{n} {p}\n" for n, p in passwords.items()))
        path.chmod(0o600)
        note = str(path)
    host = env.get("LW_CONSOLE_HOST") or "127.0.0.1"
    return extra, f"http://{host}:{port}", note


def _any_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
