"""Running the `loopwarden` CLI as a user would: a subprocess with a clean environment, and finding the processes
a command started (by a marker in their environment)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.paths import ROOT
from tests.support.timing import bound


def inherits(environ: Path, tmp_path: Path) -> bool:
    """Whether the process whose ``environ`` file this is runs with ``LW_STATE_DIR`` at ``tmp_path``."""
    try:
        return f"LW_STATE_DIR={tmp_path}".encode() in environ.read_bytes().split(b"\0")
    except OSError:
        return False


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without what would point a command at another stack, plus ``extra``."""
    drop = ("NATS_URL", "LW_NATS_URL", "ANTHROPIC_API_KEY", "LW_STATE_DIR", "XDG_STATE_HOME", "PYTHONIOENCODING")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **extra}


def lw(
    *args: str, env: dict[str, str], cwd: Path = ROOT, timeout: float = bound(120)
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loopwarden.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def marked(marker: str) -> list[str]:
    """The pids whose environment holds ``marker`` (``NAME=value``)."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if marker.encode() in environ.read_bytes().split(b"\0"):
                found.append(environ.parent.name)
        except OSError:
            continue
    return found
