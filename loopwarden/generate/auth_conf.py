"""Generate the shipped ``deploy/nats/auth.conf`` from the example access file, ``deploy/access.yaml``
(``loopwarden.auth_conf``; no secrets in it: users without a hash read their password from the environment).
``tests/locked/test_permissions.py`` fails when the file and the grants disagree."""

from __future__ import annotations

from pathlib import Path

from loopwarden.auth_conf import auth_conf
from loopwarden.generate import ROOT
from shared.access import EXAMPLE

OUT = ROOT / "deploy" / "nats" / "auth.conf"
EXAMPLE_FILE = ROOT / "deploy" / "access.yaml"


def write() -> list[Path]:
    OUT.write_text(auth_conf(EXAMPLE, "deploy/access.yaml"))
    return [OUT]
