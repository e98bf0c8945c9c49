"""The wire catalogue, the client, the run tree and the tool-author API are packages behind one face each
(issues 25, 37): every name the tree imports comes from the face, every public name a part defines is on it,
each part is one concept of a readable size, and the parts import one another one way (the face above them)."""

from __future__ import annotations

import ast
import functools
import importlib
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.paths import ROOT

FACES = ("shared.messages", "loopwarden.client", "loopwarden.runtree", "shared.tools")
SOURCES = ("shared", "services", "loopwarden", "bench", "tests")
PART_MAX_LINES = 500


def package_dir(face: str) -> Path:
    module = importlib.import_module(face)
    assert module.__file__ is not None and module.__file__.endswith("__init__.py"), f"{face} is not a package"
    return Path(module.__file__).parent


def parts(face: str) -> dict[str, Path]:
    return {f"{face}.{p.stem}": p for p in sorted(package_dir(face).glob("*.py")) if p.stem != "__init__"}


def defined_names(path: Path) -> list[str]:
    """The public names a module defines at its top level (classes, functions, constants, type aliases)."""
    names: list[str] = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return [n for n in names if not n.startswith("_")]


@functools.cache
def imports_by_module() -> dict[str, dict[str, set[str]]]:
    """Every ``from module import name`` in the tree (at any depth): module -> file -> names."""
    found: dict[str, dict[str, set[str]]] = {}
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = found.setdefault(node.module, {}).setdefault(str(path.relative_to(ROOT)), set())
                    names.update(a.name for a in node.names)
    return found


def imported_from(module: str) -> dict[str, set[str]]:
    """Every name the tree imports from ``module``, by file."""
    return imports_by_module().get(module, {})


def internal_imports(face: str, path: Path) -> set[str]:
    """The modules of ``face``'s package (the face itself included) that ``path`` imports."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == face or node.module.startswith(face + "."):
                out.add(node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name == face or a.name.startswith(face + ".")}
    return out


def face_of(face: str) -> ModuleType:
    return importlib.import_module(face)


@pytest.mark.parametrize("face", FACES)
def test_every_name_the_tree_imports_from_a_face_is_on_it(face: str) -> None:
    module = face_of(face)
    missing = {
        where: sorted(n for n in names if n not in module.__all__ or not hasattr(module, n))
        for where, names in imported_from(face).items()
    }
    missing = {where: names for where, names in missing.items() if names}
    assert not missing, f"{face} does not offer what these files import: {missing}"


@pytest.mark.parametrize("face", FACES)
def test_every_public_name_a_part_defines_is_on_its_face(face: str) -> None:
    module = face_of(face)
    # the client's parts are the classes ``Client`` is made of: reached through ``Client``, not named
    made_of = {c.__name__ for c in getattr(module, "Client", object).__mro__}
    for name, path in parts(face).items():
        hidden = [n for n in defined_names(path) if n not in module.__all__ and n not in made_of]
        assert not hidden, f"{name} defines {hidden}, which {face} does not re-export"
        part = importlib.import_module(name)
        for n in defined_names(path):
            if n in module.__all__:
                assert getattr(module, n) is getattr(part, n), f"{face}.{n} is not {name}.{n}"


@pytest.mark.parametrize("face", FACES)
def test_each_part_is_a_readable_module(face: str) -> None:
    sizes = {name: len(path.read_text().splitlines()) for name, path in parts(face).items()}
    assert len(sizes) >= 2, f"{face} has no parts"
    too_big = {name: n for name, n in sizes.items() if n > PART_MAX_LINES}
    assert not too_big, f"parts over {PART_MAX_LINES} lines: {too_big}"


@pytest.mark.parametrize("face", FACES)
def test_parts_import_one_another_one_way_and_never_their_face(face: str) -> None:
    graph = {name: internal_imports(face, path) for name, path in parts(face).items()}
    through_face = sorted(name for name, imports in graph.items() if face in imports)
    assert not through_face, f"these parts import their own face (a circle through it): {through_face}"
    state: dict[str, str] = {}

    def visit(node: str, trail: list[str]) -> None:
        if state.get(node) == "done":
            return
        assert state.get(node) != "open", f"parts of {face} import each other in a circle: {[*trail, node]}"
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            visit(nxt, [*trail, node])
        state[node] = "done"

    for node in graph:
        visit(node, [])


def test_a_face_re_exports_what_the_old_single_module_offered() -> None:
    """Spot checks of names that only ever lived in the single modules (each part's own checks cover the rest)."""
    messages, client, runtree = (face_of(f) for f in ("shared.messages", "loopwarden.client", "loopwarden.runtree"))
    for name in ("WIRE_MODELS", "FailureType", "SCHEMA_FAILURES", "EscalationAction", "needs_human", "utcnow"):
        assert name in messages.__all__, name
    assert all(m.__module__.startswith("shared.messages.") for m in messages.WIRE_MODELS)
    for name in ("Client", "Event", "Watch", "probe", "tool_metrics", "tool_outcomes", "new_run_id"):
        assert name in client.__all__, name
    for name in ("build", "step_detail", "Section", "Step", "RunTree", "clip"):
        assert name in runtree.__all__, name
