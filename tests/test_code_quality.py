"""CI runs `make test`; these keep the code to the project's own bar (ruff, ruff format, mypy strict)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

BIN = Path(sys.executable).parent
PATHS = ["shared", "services", "loopwarden", "tests", "bench"]


def run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff() -> None:
    lint = run(str(BIN / "ruff"), "check", *PATHS)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    fmt = run(str(BIN / "ruff"), "format", "--check", *PATHS)
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


def test_mypy_strict() -> None:
    typed = run(str(BIN / "mypy"))
    assert typed.returncode == 0, typed.stdout + typed.stderr
