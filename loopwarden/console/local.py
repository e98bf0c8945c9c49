"""A console started by the local stack (``make run`` / ``loopwarden up``): a port, and — when
``LW_CONSOLE_USERS`` is not set — a fresh random password per operator of the roster, written to a
file in the stack's state folder by the console itself (never a fixed default password).

The stack imports only this module's light half (no bus, no bcrypt), so a Ctrl-C during start-up
lands in code that stops cleanly."""

from __future__ import annotations

import re
import socket
from pathlib import Path

DEFAULT_PORT = 8700
PASSWORDS_FILE = "console-passwords.txt"


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def console_env(state_dir: Path, env: dict[str, str]) -> tuple[dict[str, str], str, str | None]:
    """(extra environment, console URL, path of the generated passwords file or None)."""
    extra: dict[str, str] = {}
    configured = env.get("LW_CONSOLE_PORT")
    if configured is None:  # 8700 when free, else any port (the console says which in its ready line)
        configured = str(DEFAULT_PORT) if _free(DEFAULT_PORT) else "0"
        extra["LW_CONSOLE_PORT"] = configured
    note = None
    if not env.get("LW_CONSOLE_USERS"):
        note = str(state_dir / PASSWORDS_FILE)
        extra["LW_CONSOLE_PASSWORDS_FILE"] = note
    host = env.get("LW_CONSOLE_HOST") or "127.0.0.1"
    return extra, f"http://{host}:{configured}", note


def url_from_log(text: str) -> str | None:
    """The console's address from its ready line (the real port, also when it was chosen at bind)."""
    found = re.search(r"loopwarden-console ready on (http://\S+)", text)
    return found.group(1) if found else None


def generated_users(path: Path, operators: list[str]) -> str:
    """Write a fresh password per operator to ``path`` (mode 600); the ``LW_CONSOLE_USERS`` value for them."""
    import json
    import secrets

    from loopwarden.console.auth import hash_password

    passwords = {name: secrets.token_urlsafe(9) for name in operators}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{n} {p}\n" for n, p in passwords.items()))
    path.chmod(0o600)
    return json.dumps({n: hash_password(p, rounds=10) for n, p in passwords.items()})
