"""Generate ``auth.conf`` from an access file (``shared/access.py``), the grants in ``shared/permissions.py``
(their publish rights from the channel table, ``shared/channels.py``) and the tools the executor hosts.

``make schemas`` (``python -m loopwarden.auth_conf`` without arguments) writes the shipped
``deploy/nats/auth.conf`` from the example, ``deploy/access.yaml`` (drift-tested); an admin writes a
deployment's with ``loopwarden config apply FILE --auth-conf PATH`` (or ``python -m loopwarden.auth_conf
--access FILE --out PATH``), wherever the servers read it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from shared.access import EXAMPLE, AccessError, AccessFile, load_access
from shared.permissions import Grant as Grant
from shared.permissions import grants, render

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "deploy" / "nats" / "auth.conf"
EXAMPLE_FILE = ROOT / "deploy" / "access.yaml"


def hosted_tools() -> list[str]:
    """The tools the executor registers with the current settings (each gets its own durable)."""
    from services.executor.app import load_registry
    from shared.settings import Settings

    return sorted(load_registry(Settings()).tools)


def all_grants(access: AccessFile = EXAMPLE) -> dict[str, Grant]:
    return grants(hosted_tools(), access)


def auth_conf(access: AccessFile = EXAMPLE, source: str = "deploy/access.yaml") -> str:
    return render(hosted_tools(), access, source)


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m loopwarden.auth_conf",
        description="Write auth.conf from an access file (default: the shipped example, into deploy/nats/auth.conf).",
    )
    parser.add_argument("--access", metavar="FILE", help="the access file (default: the example, deploy/access.yaml)")
    parser.add_argument("--out", metavar="PATH", help="where to write auth.conf (default: deploy/nats/auth.conf)")
    args = parser.parse_args(argv)
    if args.access is None:
        access, source = EXAMPLE, "deploy/access.yaml"
    else:
        try:
            access, source = load_access(args.access), Path(args.access).name
        except AccessError as err:
            print(f"auth_conf: {err}", file=sys.stderr)
            return 2
    if args.out is None and not (ROOT / "deploy" / "nats").is_dir():  # an installed package: no folder of its own
        print("auth_conf: give --out PATH (where your nats-server includes auth.conf)", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else OUT
    if args.out is None and args.access is None:
        out.write_text(auth_conf(access, source))  # the shipped, reviewable file: no secrets in it
    else:
        write_private(out, auth_conf(access, source))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
