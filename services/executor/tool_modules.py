"""Finding the user's tool modules: named in ``LW_TOOL_MODULES`` or as ``loopwarden.tools`` entry points.

Importing a module runs its ``@tool`` declarations. Nothing is found through ``PYTHONPATH`` by
accident: a module is either installed (a dotted name, or an entry point of an installed package)
or given as a file path (``/path/to/stock_tools.py``), loaded from that file. A module that cannot
be imported is reported in one line saying which module, where it was named and what to set.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType

ENTRY_POINT_GROUP = "loopwarden.tools"
SETTING = "LW_TOOL_MODULES"


@dataclass(frozen=True)
class ToolModuleProblem:
    module: str
    source: str  # where it was named: the setting or the entry point
    reason: str

    def __str__(self) -> str:
        return f"tool module '{self.module}' (from {self.source}) cannot be imported: {self.reason}"


def named_modules(setting: str | None) -> list[str]:
    """The comma list of ``LW_TOOL_MODULES``: dotted module names or ``.py`` file paths."""
    return [part.strip() for part in (setting or "").split(",") if part.strip()]


def is_path(name: str) -> bool:
    return name.endswith(".py") or "/" in name


def import_named(name: str, source: str) -> ModuleType | ToolModuleProblem:
    """Import one module by dotted name or file path; a problem says what to set instead of a traceback."""
    if is_path(name):
        path = Path(name).expanduser().resolve()
        if not path.is_file():
            return ToolModuleProblem(name, source, f"no such file {path}; give {SETTING} an existing .py file")
        module_name = path.stem
        if module_name in sys.modules and getattr(sys.modules[module_name], "__file__", None) == str(path):
            return sys.modules[module_name]
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            return ToolModuleProblem(name, source, "not a Python module file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # before running it: typed annotations resolve through it
        try:
            spec.loader.exec_module(module)
        except Exception as err:
            del sys.modules[module_name]
            return ToolModuleProblem(name, source, f"{type(err).__name__}: {err}")
        return module
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name and name.startswith(err.name):  # the module itself (or its package) is not installed
            return ToolModuleProblem(
                name,
                source,
                f"no module named '{err.name}'; install the package that holds it, or set {SETTING} to the "
                "file's path (e.g. /path/to/stock_tools.py)",
            )
        return ToolModuleProblem(name, source, f"{type(err).__name__}: {err}")  # something it imports is missing
    except Exception as err:
        return ToolModuleProblem(name, source, f"{type(err).__name__}: {err}")


def import_tool_modules(setting: str | None) -> tuple[list[ModuleType], list[ToolModuleProblem]]:
    """Every module named by the setting and by installed ``loopwarden.tools`` entry points."""
    modules: list[ModuleType] = []
    problems: list[ToolModuleProblem] = []
    named = [(name, SETTING) for name in named_modules(setting)]
    named += [(ep.value.partition(":")[0], f"entry point '{ep.name}'") for ep in entry_points(group=ENTRY_POINT_GROUP)]
    for name, source in named:
        found = import_named(name, source)
        (problems if isinstance(found, ToolModuleProblem) else modules).append(found)  # type: ignore[arg-type]
    return modules, problems
