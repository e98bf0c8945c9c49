"""``auth.conf`` from an access file (``shared/access.py``), the grants in ``shared/permissions.py`` (their
publish rights from the channel table, ``shared/channels.py``) and the tools the executor hosts
(``services.declared.hosted_tools``).

An admin writes a deployment's with ``loopwarden config apply FILE --auth-conf PATH``, wherever the servers
read it; ``make schemas`` writes the shipped ``deploy/nats/auth.conf`` from the example, ``deploy/access.yaml``
(``loopwarden/generate/auth_conf.py``, drift-tested).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from shared.access import EXAMPLE, AccessFile
from shared.permissions import Grant as Grant
from shared.permissions import grants, render


def hosted_tools() -> list[str]:
    """The tools the executor registers with the current settings (each gets its own durable)."""
    from services.declared import hosted_tools as hosted
    from shared.settings import Settings

    return hosted(Settings())


def all_grants(access: AccessFile = EXAMPLE) -> dict[str, Grant]:
    return grants(hosted_tools(), access)


def auth_conf(access: AccessFile = EXAMPLE, source: str = "deploy/access.yaml", upgrading: bool = False) -> str:
    return render(hosted_tools(), access, source, upgrading)


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` at once (a temporary file beside it, renamed over it: a server reloading
    meanwhile reads the old file or the new one, never half), readable by its owner and group only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o640)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
