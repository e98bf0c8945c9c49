"""Generate ``deploy/nats/auth.conf`` from the grants in ``shared/permissions.py`` (their publish rights
from the channel table, ``shared/channels.py``) and the tools the executor hosts (``make schemas``, or
``python -m loopwarden.auth_conf``; drift-tested)."""

from __future__ import annotations

import sys
from pathlib import Path

from shared.permissions import Grant as Grant
from shared.permissions import grants, render

OUT = Path(__file__).resolve().parents[1] / "deploy" / "nats" / "auth.conf"


def hosted_tools() -> list[str]:
    """The tools the executor registers with the default settings (each gets its own durable)."""
    from services.executor.app import load_registry
    from shared.settings import Settings

    return sorted(load_registry(Settings()).tools)


def all_grants() -> dict[str, Grant]:
    return grants(hosted_tools())


def auth_conf() -> str:
    return render(hosted_tools())


def main() -> int:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(auth_conf())
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
