"""The test suite's shape (issue 37, item 6): a module's folder says what it starts, one fixture name per kind of
stack, helpers in one home.

- Test modules live in the five folders: ``unit/`` (pure, no server), ``repo/`` (checks of the repository, no
  server), ``stack/`` (the session stack), ``locked/`` (the generated auth.conf enforced), ``own/`` (processes of
  the module's own); the top of ``tests/`` holds only ``conftest.py``.
- ``stack`` and ``client`` are defined in ``tests/stack/conftest.py`` only, ``locked`` in ``tests/locked/conftest.py``
  only: a module's own stack gets a fixture named for what it starts (``flow_client``, ``fleet``, ``cluster``).
- Helpers a module shares live in ``tests/support/``, never in a ``conftest.py`` or another test module, so a reader
  finds them in one place and importing a test module never collects (or starts) another's fixtures.
- A module in ``unit/`` or ``repo/`` starts no server: it names no stack helper (``LocalStack``, ``locked_stack``,
  ``nats_server_binary``, ...), runs no ``nats-server`` and asks for no stack fixture.
"""

from __future__ import annotations

import ast

from tests.support.paths import ROOT

TESTS = ROOT / "tests"
FOLDERS = ("unit", "repo", "stack", "locked", "own")
NO_SERVER = ("unit", "repo")
# each stack fixture's one home
HOMES = {
    "stack": "tests/stack/conftest.py",
    "client": "tests/stack/conftest.py",
    "locked": "tests/locked/conftest.py",
}
# what starts a server: the stack helpers, and the fixtures that hand one out
STARTERS = frozenset(
    {"LocalStack", "locked_stack", "locked_server", "locked_deployment", "OwnLocked", "own_stack", "nats_server_binary"}
)
NATS_SERVER = "nats" + "-server"  # spelled apart, so that this module runs none by the rule it states
STACK_FIXTURES = frozenset({*HOMES, "one_each", "no_planner", "one_client", "production_deployment"})


def is_test_module(where: str) -> bool:
    name = where.rsplit("/", 1)[-1]
    return name.startswith("test_") and name.endswith(".py")


def imported_test_module(module: str) -> bool:
    """``tests.conftest`` or a test module (``tests.test_x``, ``tests.unit.test_y``), or a folder's conftest."""
    parts = module.split(".")
    return parts[0] == "tests" and (parts[-1] == "conftest" or parts[-1].startswith("test_"))


def is_fixture(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any("fixture" in ast.unparse(d) for d in node.decorator_list)


def fixture_name(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    """The name a fixture is requested by: ``@pytest.fixture(name=...)``'s, else the function's."""
    for d in node.decorator_list:
        if isinstance(d, ast.Call):
            for kw in d.keywords:
                if kw.arg == "name" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                    return kw.value.value
    return node.name


def place(where: str) -> list[str]:
    """A test module outside the five folders."""
    parts = where.split("/")
    if parts[0] != "tests" or not is_test_module(where):
        return []
    if len(parts) == 3 and parts[1] in FOLDERS:
        return []
    folders = ", ".join(f"tests/{f}/" for f in FOLDERS)
    return [
        f"{where}: a test module outside the suite's folders; move it to the one that says what it starts ({folders})"
    ]


def imports(where: str, tree: ast.Module) -> list[str]:
    found: list[str] = []
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
    return found


def redefinitions(where: str, tree: ast.Module) -> list[str]:
    """``stack``, ``client`` or ``locked`` defined outside its home: in a test module any top-level function of that
    name, elsewhere a fixture requested by it."""
    found: list[str] = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        name = fixture_name(node) if is_fixture(node) else node.name
        if name in HOMES and where != HOMES[name] and (is_test_module(where) or is_fixture(node)):
            found.append(
                f"{where}:{node.lineno}: defines {name!r}, whose one home is {HOMES[name]}; "
                f"name the module's own for what it starts (e.g. flow_{name}, fleet, cluster)"
            )
    return found


def servers(where: str, tree: ast.Module) -> list[str]:
    """In ``unit/`` or ``repo/``: what starts a server, or asks for one."""
    parts = where.split("/")
    if len(parts) < 3 or parts[0] != "tests" or parts[1] not in NO_SERVER:
        return []
    folder = f"tests/{parts[1]}/"
    found: list[str] = []
    for node in ast.walk(tree):
        named = ""
        if isinstance(node, ast.Name) and node.id in STARTERS:
            named = node.id
        elif isinstance(node, ast.Attribute) and node.attr in STARTERS:
            named = node.attr
        elif isinstance(node, ast.alias) and node.name.rsplit(".", 1)[-1] in STARTERS:
            named = node.name
        elif isinstance(node, ast.Constant) and node.value == NATS_SERVER:
            named = NATS_SERVER
        if named:
            line = getattr(node, "lineno", 0)
            found.append(f"{where}:{line}: uses {named}: a module in {folder} starts no server; move it to own/")
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and (
            node.name.startswith("test_") or is_fixture(node)
        ):
            asked = [a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)]
            found += [
                f"{where}:{node.lineno}: {node.name} asks for the fixture {a!r}: a module in {folder} starts no "
                "server; move it to stack/ or locked/"
                for a in asked
                if a in STACK_FIXTURES
            ]
    return found


def violations(where: str, source: str) -> list[str]:
    """What in one file of ``tests/`` (``where``: its path from the repository root) breaks the suite's shape, one
    line each, naming file and line."""
    tree = ast.parse(source)
    return place(where) + imports(where, tree) + redefinitions(where, tree) + servers(where, tree)


def test_the_suite_keeps_its_shape() -> None:
    found = [
        v
        for path in sorted(TESTS.rglob("*.py"))
        for v in violations(path.relative_to(ROOT).as_posix(), path.read_text())
    ]
    assert not found, "the test suite's shape is broken:\n" + "\n".join(found)


def test_the_top_of_tests_holds_the_conftest_and_the_folders_only() -> None:
    kept = {"__init__.py", "conftest.py", "support", "tools", "ecosystem_tools", *FOLDERS}
    extra = sorted(
        p.name for p in TESTS.iterdir() if p.name not in kept and not p.name.startswith((".", "__pycache__"))
    )
    assert not extra, f"tests/ holds {extra}: a test module goes to one of tests/{{{','.join(FOLDERS)}}}/"
    for folder in FOLDERS:
        assert (TESTS / folder / "__init__.py").is_file(), f"tests/{folder}/ is not a package: two modules may clash"


def test_the_check_sees_each_kind_of_break() -> None:
    t = "tests"  # spelled apart, so that a grep of the suite for such imports finds none here
    bad = {
        ("tests/stack/test_x.py", f"from {t}.conftest import TEST_ENV"): "tests.conftest",
        ("tests/stack/test_x.py", f"import {t}.conftest"): "tests.conftest",
        ("tests/stack/test_x.py", f"from {t} import conftest"): "tests.conftest",
        ("tests/stack/test_x.py", f"from {t}.stack.conftest import stack"): "tests.stack.conftest",
        ("tests/own/test_x.py", f"from {t}.own.test_console import CHROMIUM"): "tests.own.test_console",
        ("tests/unit/test_x.py", f"from {t}.unit.test_planner_transitions import new_run"): "test_planner_transitions",
        ("tests/unit/test_x.py", f"from {t}.unit import test_planner_transitions"): "test_planner_transitions",
        ("tests/stack/test_x.py", "from .test_cost import tenant_spent"): "imports from test_cost",
        ("tests/support/runs.py", f"from {t}.conftest import TEST_ENV"): "tests.conftest",
        # a test module at the top, or in a folder that says nothing
        ("tests/test_x.py", "def test_x(): ..."): "outside the suite's folders",
        ("tests/support/test_x.py", "def test_x(): ..."): "outside the suite's folders",
        ("tests/stack/more/test_x.py", "def test_x(): ..."): "outside the suite's folders",
        # a stack fixture outside its home
        ("tests/stack/test_x.py", "@pytest.fixture\nasync def client(x): ..."): "defines 'client'",
        ("tests/own/test_x.py", "@pytest.fixture(scope='module')\ndef stack(x): ..."): "defines 'stack'",
        ("tests/locked/test_x.py", "@pytest.fixture(scope='module')\ndef locked(x): ..."): "defines 'locked'",
        ("tests/locked/test_x.py", "def locked(x): ..."): "defines 'locked'",
        ("tests/own/test_x.py", "@pytest.fixture(name='client')\ndef fleet_client(x): ..."): "defines 'client'",
        ("tests/own/conftest.py", "@pytest.fixture\ndef stack(x): ..."): "defines 'stack'",
        ("tests/conftest.py", "@pytest.fixture\ndef locked(x): ..."): "defines 'locked'",
        ("tests/stack/conftest.py", "@pytest.fixture\ndef locked(x): ..."): "defines 'locked'",
        # a server started, or asked for, where none may be
        ("tests/unit/test_x.py", "from loopwarden.stack import LocalStack"): "uses LocalStack",
        ("tests/unit/test_x.py", "def test_x(t):\n    stack.LocalStack(state_dir=t)"): "uses LocalStack",
        ("tests/repo/test_x.py", "from tests.support import locked as L\nL.locked_stack(t)"): "uses locked_stack",
        ("tests/repo/test_x.py", "subprocess.run(['nats-server', '-js'])"): "uses nats-server",
        ("tests/repo/test_x.py", "subprocess.run([nats_server_binary(), '-js'])"): "uses nats_server_binary",
        ("tests/unit/test_x.py", "def test_x(client): ..."): "asks for the fixture 'client'",
        ("tests/unit/test_x.py", "async def test_x(locked): ..."): "asks for the fixture 'locked'",
        ("tests/repo/test_x.py", "@pytest.fixture\ndef mine(one_each): ..."): "asks for the fixture 'one_each'",
    }
    for (where, source), said in bad.items():
        (line,) = violations(where, source)
        assert line.startswith(f"{where}:") and said in line, (where, source, line)


def test_helpers_from_support_and_fixtures_named_for_their_stack_pass() -> None:
    good = (
        "from tests.support.stacks import TEST_ENV, running\n"
        "from tests.support import runs\n"
        "@pytest.fixture\nasync def flow_client(flow_stack): ...\n"
        "def test_x(client): ...\n"
    )
    assert violations("tests/stack/test_x.py", good) == []
    assert violations("tests/locked/test_x.py", "LOCKED = L.OwnLocked('x', ('planner',), {})\n") == []
    assert violations("tests/own/test_x.py", "from loopwarden.stack import LocalStack\nLocalStack(state_dir=t)") == []
    # a pure module may name a server in prose and use loopwarden.stack's tables
    pure = '"""what nats-server reads"""\nfrom loopwarden.stack import SERVICES\ndef test_x(tmp_path): ...\n'
    assert violations("tests/unit/test_x.py", pure) == []
    # each fixture's home defines it
    assert violations("tests/stack/conftest.py", "@pytest.fixture\ndef client(stack): ...\ndef stack(): ...") == []
    assert violations("tests/locked/conftest.py", "@pytest.fixture(scope='module')\ndef locked(request): ...") == []
