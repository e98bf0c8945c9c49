"""The wheel's layout (everything else is in pyproject.toml).

The repository keeps ``shared/``, ``services/`` and ``loopwarden/`` side by side (an editable install
and the tests use them as they are). A built wheel claims one top-level name: ``shared`` and
``services`` are installed as ``loopwarden.shared`` and ``loopwarden.services`` (their imports, and
the shipped contracts' entrypoints, rewritten to match), with ``schemas/`` and ``scenarios/`` as
``loopwarden/schemas`` and ``loopwarden/scenarios`` (found by ``loopwarden.data`` and by the paths
the code already derives from its own location).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
MOVED = ("shared", "services")
DATA = ("schemas", "scenarios")
IMPORT = re.compile(r"^(\s*)(from|import)\s+(shared|services)(?=[.\s])", re.M)
ENTRYPOINT = re.compile(r'"(entrypoint|postHook)":\s*"services\.')


def namespaced(text: str) -> str:
    return IMPORT.sub(r"\1\2 loopwarden.\3", text)


class NamespacedBuildPy(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):  # `pip install -e .`: the repository as it is
            return
        root = Path(self.build_lib)
        target = root / "loopwarden"
        for name in MOVED:
            if (root / name).exists():
                shutil.rmtree(target / name, ignore_errors=True)
                shutil.move(str(root / name), str(target / name))
        for py in target.rglob("*.py"):
            text = py.read_text(encoding="utf-8")
            if namespaced(text) != text:
                py.write_text(namespaced(text), encoding="utf-8")
        for name in DATA:
            shutil.rmtree(target / name, ignore_errors=True)
            shutil.copytree(ROOT / name, target / name)
        for contract in (target / "schemas" / "tools").glob("*.json"):
            text = contract.read_text(encoding="utf-8")
            contract.write_text(ENTRYPOINT.sub(r'"\1": "loopwarden.services.', text), encoding="utf-8")


class NamespacedBdistWheel(bdist_wheel):
    def egg2dist(self, egginfo_path: str, distinfo_path: str) -> None:
        super().egg2dist(egginfo_path, distinfo_path)
        top_level = Path(distinfo_path) / "top_level.txt"
        if top_level.exists():  # the one name the wheel installs
            top_level.write_text("loopwarden\n")


setup(cmdclass={"build_py": NamespacedBuildPy, "bdist_wheel": NamespacedBdistWheel})
