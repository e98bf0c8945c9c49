"""The test suite's shape (issue 37, item 6): ``client`` and ``stack`` mean the session stack's, defined once in a
conftest, so a test module's own stack gets a fixture named for what it starts (``flow_client``, ``runview_stack``);
helpers a module shares live in ``tests/support/``, never in ``conftest.py`` or in another test module, so a
reader finds them in one place and importing a test module never collects (or starts) another's fixtures."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.paths import ROOT

TESTS = ROOT / "tests"
SESSION_NAMES = ("client", "stack")  # the session stack's fixtures (tests/conftest.py)


def is_test_module(path: Path) -> bool:
    return path.name.startswith("test_") and path.suffix == ".py"


def imported_test_module(module: str) -> bool:
    """``tests.conftest`` or a test module (``tests.test_x``, ``tests.unit.test_y``)."""
    parts = module.split(".")
    return parts[0] == "tests" and (parts[-1] == "conftest" or parts[-1].startswith("test_"))


def violations(where: str, source: str, test_module: bool) -> list[str]:
    """What in one module of ``tests/`` breaks the suite's shape, one line each, naming file and line."""
    found: list[str] = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:  # relative: `from .test_x import y` or `from . import conftest`
                names = [node.module] if node.module else [a.name for a in node.names]
                bad = [n for n in names if n == "conftest" or n.startswith("test_")]
            else:
                bad = [node.module] if node.module and imported_test_module(node.module) else []
                bad += [
                    f"{node.module}.{a.name}" for a in node.names if imported_test_module(f"{node.module}.{a.name}")
                ]
            found += [f"{where}:{node.lineno}: imports from {b}; move what it needs to tests/support/" for b in bad]
        elif isinstance(node, ast.Import):
            found += [
                f"{where}:{node.lineno}: imports {a.name}; move what it needs to tests/support/"
                for a in node.names
                if imported_test_module(a.name)
            ]
    if test_module:
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in SESSION_NAMES:
                found.append(
                    f"{where}:{node.lineno}: defines {node.name!r}, the session stack's fixture; "
                    f"name the module's own for what it starts (e.g. flow_{node.name})"
                )
    return found


def test_no_test_module_redefines_the_session_fixtures_or_imports_conftest_or_another_test_module() -> None:
    found = [
        v
        for path in sorted(TESTS.rglob("*.py"))
        for v in violations(str(path.relative_to(ROOT)), path.read_text(), is_test_module(path))
    ]
    assert not found, "the test suite's shape is broken:\n" + "\n".join(found)


def test_the_check_sees_each_kind_of_break() -> None:
    t = "tests"  # spelled apart, so that a grep of the suite for such imports finds none here
    bad = {
        f"from {t}.conftest import TEST_ENV": "tests.conftest",
        f"import {t}.conftest": "tests.conftest",
        f"from {t} import conftest": "tests.conftest",
        f"from {t}.test_console import CHROMIUM": "tests.test_console",
        f"from {t}.unit.test_planner_transitions import new_run": "tests.unit.test_planner_transitions",
        f"from {t}.unit import test_planner_transitions": "tests.unit.test_planner_transitions",
        "from .test_cost import tenant_spent": "imports from test_cost",
        "@pytest.fixture\nasync def client(x): ...": "defines 'client'",
        "@pytest.fixture(scope='module')\ndef stack(x): ...": "defines 'stack'",
    }
    for source, said in bad.items():
        (line,) = violations("tests/test_x.py", source, test_module=True)
        assert line.startswith("tests/test_x.py:") and said in line, (source, line)


def test_helpers_from_support_and_fixtures_named_for_their_stack_pass() -> None:
    good = (
        "from tests.support.stacks import TEST_ENV, running\n"
        "from tests.support import runs\n"
        "@pytest.fixture\nasync def flow_client(flow_stack): ...\n"
        "def test_x(client): ...\n"
    )
    assert violations("tests/test_x.py", good, test_module=True) == []
    # a conftest defines them: that is their one home
    assert violations("tests/conftest.py", "def client(stack): ...\ndef stack(): ...", test_module=False) == []
