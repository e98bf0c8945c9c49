"""CI runs `make test`; these keep the code to the project's own bar (ruff, ruff format, mypy strict)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.paths import ROOT
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


def loaded_by_name(path: Path) -> set[str]:
    """The top-level packages a file loads through ``importlib.import_module`` / ``__import__`` with a module
    name it spells in a string (an f-string too): an import the ``import`` statements above do not show."""
    import ast
    import re

    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name not in ("import_module", "__import__"):
            continue
        for arg in node.args:
            for part in ast.walk(arg):
                if isinstance(part, ast.Constant) and isinstance(part.value, str):
                    found |= set(re.findall(r"(?:^|\.)(services|loopwarden)(?=\.|$)", part.value))
    return found


# Dependencies point one way, with no exemption (issue 37): entry points and surfaces (loopwarden/: the CLI,
# the web console, the client) -> the workers (services/) -> the kernel (shared/: contracts, the bus,
# settings, the tool author's API). shared/ imports neither; a worker imports no entry point and no other
# worker; the public face (loopwarden/__init__.py) and the read models the console and the CLI share import
# no service and no surface, so a tool author's import loads no worker and the console and the terminal
# stand on the same floor.
FORBIDDEN = {
    "shared": ("services", "loopwarden"),
    "services": ("loopwarden",),
}
# Build time (make schemas: the generators, the release's contract check) stands above everything; nothing that
# runs imports it, and the wheel does not carry it.
BUILD_TIME = "loopwarden.generate"
READ_MODELS = ("records.py", "record_sources.py", "replay.py", "runtext.py", "runtree/")


def is_surface(module: str) -> bool:
    """The web console or the CLI (``loopwarden.cli``, ``loopwarden.cli_*``): not ``loopwarden.client``."""
    parts = module.split(".")
    return (
        parts[0] == "loopwarden" and len(parts) > 1 and (parts[1] in ("console", "cli") or parts[1].startswith("cli_"))
    )


def wrong_imports(root: Path = ROOT) -> list[str]:
    wrong = []
    for top, forbidden in FORBIDDEN.items():
        for path in sorted((root / top).rglob("*.py")):
            for module in imports_of(path):
                if module.split(".")[0] in forbidden:
                    wrong.append(f"{path.relative_to(root)} imports {module}")
            wrong += [
                f"{path.relative_to(root)} loads {top} by name" for top in sorted(loaded_by_name(path) & {*forbidden})
            ]
    for top in (*FORBIDDEN, "loopwarden", "bench"):
        for path in sorted((root / top).rglob("*.py")):
            if path.is_relative_to(root / BUILD_TIME.replace(".", "/")):
                continue
            for module in imports_of(path):
                if module == BUILD_TIME or module.startswith(BUILD_TIME + "."):
                    wrong.append(f"{path.relative_to(root)} (run time) imports the build-time {module}")
    for path in sorted((root / "services").rglob("*.py")):
        inside = path.relative_to(root / "services").parts
        if len(inside) == 1:  # the floor's own face (services/declared.py: what every worker declares)
            continue
        own = inside[0]
        for module in imports_of(path):
            parts = module.split(".")
            if parts[0] == "services" and len(parts) > 1 and parts[1] != own:
                wrong.append(f"{path.relative_to(root)} imports another worker's {module}")
    face = root / "loopwarden" / "__init__.py"
    if face.exists():
        wrong += [f"loopwarden/__init__.py imports {m}" for m in imports_of(face) if m.split(".")[0] == "services"]
    for path in sorted((root / "loopwarden").rglob("*.py")):
        if not str(path.relative_to(root / "loopwarden")).startswith(READ_MODELS):
            continue
        for module in imports_of(path):
            if module.split(".")[0] == "services" or is_surface(module):
                wrong.append(f"{path.relative_to(root)} (a shared read model) imports {module}")
    return wrong


def test_dependencies_point_one_way() -> None:
    wrong = wrong_imports()
    assert wrong == [], "\n".join(wrong)


def test_the_dependency_rule_sees_each_arrow_that_runs_the_wrong_way(tmp_path: Path) -> None:
    """Each rule above, broken once in a small tree, is reported (lazy imports too); the allowed arrows are not."""
    files = {
        "shared/a.py": "from services.planner import app\n",
        "services/judge/x.py": "def f():\n    from services.planner.ids import run_key\n",
        "services/judge/y.py": "from services.judge import scoring\nfrom loopwarden.client import Client\n",
        "loopwarden/__init__.py": "def _t():\n    from services.executor import registry\n",
        "loopwarden/runtext.py": "from loopwarden.console.board import duration\nfrom loopwarden import client\n",
        "loopwarden/runtree/tree.py": "from loopwarden.cli_common import say\n",
        "loopwarden/console/app.py": "from loopwarden import records\nfrom loopwarden.client import Client\n",
        "loopwarden/cli.py": "from services.executor.app import load_registry\n",
        "shared/b.py": "import importlib\nbuild = importlib.import_module(f'{__package__}services.{1}.app').build\n",
        "shared/c.py": "import importlib\nimportlib.import_module('shared.providers.anthropic')\n",
        "services/declared.py": "from services.planner.app import build\n",
        "services/judge/z.py": "from services.declared import declared\n",
        "loopwarden/infra.py": "from loopwarden.generate.asyncapi import render\n",
        "loopwarden/generate/asyncapi.py": "from services.declared import declared\nfrom loopwarden import generate\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert sorted(wrong_imports(tmp_path)) == [
        "loopwarden/__init__.py imports services.executor",
        "loopwarden/infra.py (run time) imports the build-time loopwarden.generate.asyncapi",
        "loopwarden/runtext.py (a shared read model) imports loopwarden.console.board",
        "loopwarden/runtree/tree.py (a shared read model) imports loopwarden.cli_common",
        "services/judge/x.py imports another worker's services.planner.ids",
        "services/judge/y.py imports loopwarden.client",
        "services/judge/z.py imports another worker's services.declared",
        "shared/a.py imports services.planner",
        "shared/b.py loads services by name",
    ]
