"""CI runs `make test`; these keep the code to the project's own bar (ruff, ruff format, mypy strict)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT
from tests.support.timing import bound

BIN = Path(sys.executable).parent
PATHS = ["shared", "services", "loopwarden", "tests", "bench"]


def run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=bound(300))


def test_ruff() -> None:
    lint = run(str(BIN / "ruff"), "check", *PATHS)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    fmt = run(str(BIN / "ruff"), "format", "--check", *PATHS)
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


def test_mypy_strict() -> None:
    typed = run(str(BIN / "mypy"))
    assert typed.returncode == 0, typed.stdout + typed.stderr


def imports_of(path: Path) -> set[str]:
    """The modules a file imports (absolute imports, at any depth: lazy ones count too)."""
    import ast

    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


# Dependencies point one way: entry points (loopwarden/) -> services/ -> shared/. shared/ (contracts,
# the bus, settings, permissions) imports neither; a service imports no entry point, except the web
# console, which is a surface over the client like the CLI.
FORBIDDEN = {
    "shared": ("services", "loopwarden"),
    "services": ("loopwarden",),
}
SURFACES = ("services/console/",)


def test_dependencies_point_one_way() -> None:
    wrong = []
    for top, forbidden in FORBIDDEN.items():
        for path in sorted((ROOT / top).rglob("*.py")):
            if str(path.relative_to(ROOT)).startswith(SURFACES):
                continue
            for module in imports_of(path):
                if module.split(".")[0] in forbidden:
                    wrong.append(f"{path.relative_to(ROOT)} imports {module}")
    assert wrong == [], "\n".join(wrong)
