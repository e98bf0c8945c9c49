"""Every time bound a test waits on scales with ``LW_TEST_TIME_SCALE`` (issue 28): no literal number of
seconds as a ``timeout=``/``within=`` argument, an ``asyncio.timeout(...)``, a process's ``.wait(...)`` or a test's
``timeout`` mark, no time a test measured asserted to stay under a literal number of seconds
(``assert took < bound(1.0)``), no ``client.wait(run)`` left on the library's fixed 60 s default (written as
``bound(seconds)``), and no polling loop with a fixed number of tries (``range(polls(n))``;
tests/support/timing.py)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
KEYWORDS = {"timeout", "within"}
CLOCKS = {"time.monotonic", "time.perf_counter", "time.time"}
ELAPSED = {"took", "elapsed", "waited"}  # what the suite names a time it measured


def _number(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool)


def _polls(loop: ast.For | ast.AsyncFor) -> bool:
    """``for _ in range(<number>)`` that sleeps a literal time and stops on a condition: a wait whose
    bound is tries x sleep."""
    it = loop.iter
    if not (isinstance(it, ast.Call) and ast.unparse(it.func) == "range" and it.args and _number(it.args[-1])):
        return False
    inside = list(ast.walk(loop))
    sleeps = any(
        isinstance(n, ast.Call) and ast.unparse(n.func).endswith("sleep") and n.args and _number(n.args[0])
        for n in inside
    )
    return sleeps and any(isinstance(n, ast.Break | ast.Return) for n in inside)


def _measured(expr: ast.AST) -> bool:
    """``expr`` reads a clock or a time the test measured (``time.monotonic() - started``, ``took``)."""
    return any(
        (isinstance(n, ast.Call) and ast.unparse(n.func) in CLOCKS) or (isinstance(n, ast.Name) and n.id in ELAPSED)
        for n in ast.walk(expr)
    )


def unscaled(source: str) -> list[tuple[int, str]]:
    """The calls in ``source`` that wait on a bound not written as ``bound(...)``: line and why."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.For | ast.AsyncFor) and _polls(node):
            found.append((node.lineno, f"{ast.unparse(node.iter)} tries of a polling loop"))
        if isinstance(node, ast.Assert) and isinstance(test := node.test, ast.Compare):
            below = all(isinstance(op, ast.Lt | ast.LtE) for op in test.ops)
            if below and _number(test.comparators[-1]) and _measured(test.left):
                found.append((node.lineno, f"{ast.unparse(test)}: a measured time under a literal limit"))
        if not isinstance(node, ast.Call):
            continue
        for kw in node.keywords:
            if kw.arg in KEYWORDS and _number(kw.value):
                found.append((node.lineno, f"{kw.arg}={ast.unparse(kw.value)}"))
        func = node.func
        if ast.unparse(func) == "asyncio.timeout" and node.args and _number(node.args[0]):
            found.append((node.lineno, f"asyncio.timeout({ast.unparse(node.args[0])})"))
        if ast.unparse(func).endswith("mark.timeout") and node.args and _number(node.args[0]):
            found.append((node.lineno, f"pytest.mark.timeout({ast.unparse(node.args[0])})"))
        if isinstance(func, ast.Attribute) and func.attr == "wait":
            if node.args and _number(node.args[0]):
                found.append((node.lineno, f".wait({ast.unparse(node.args[0])})"))
            receiver = ast.unparse(func.value)
            timed = any(kw.arg == "timeout" for kw in node.keywords) or len(node.args) > 1
            if "client" in receiver and node.args and not timed:
                found.append((node.lineno, f"{receiver}.wait(...) on the library's 60 s default"))
    return sorted(found)


def test_every_bound_a_test_waits_on_scales_with_the_time_scale() -> None:
    offenders = [
        f"{path.relative_to(TESTS.parent)}:{line}: {what}"
        for path in sorted(TESTS.rglob("*.py"))
        for line, what in unscaled(path.read_text())
    ]
    assert offenders == [], "write these as bound(seconds) (tests/support/timing.py):\n" + "\n".join(offenders)


def test_the_scan_finds_each_kind_of_unscaled_bound() -> None:
    source = (
        "async def t(client, proc):\n"
        "    await client.wait(run_id)\n"
        "    await client.wait(run_id, timeout=30)\n"
        "    proc.wait(10)\n"
        "    await eventually(check, what='x', within=5.0)\n"
        "    await client.wait(run_id, timeout=bound(30))\n"
        "    proc.wait(bound(10))\n"
        "    proc.wait()\n"
        "    for _ in range(50):\n"
        "        if await check():\n"
        "            break\n"
        "        await asyncio.sleep(0.1)\n"
        "    for _ in range(polls(50)):\n"
        "        if await check():\n"
        "            break\n"
        "        await asyncio.sleep(0.1)\n"
        "    for _ in range(3):\n"
        "        await asyncio.sleep(0.3)\n"
        "    started = time.monotonic()\n"
        "    assert time.monotonic() - started < 25\n"
        "    assert took < 1.0, 'slow'\n"
        "    assert took < bound(1.0) and len(xs) < 3\n"
        "    async with asyncio.timeout(20):\n"
        "        pass\n"
        "    async with asyncio.timeout(bound(20)):\n"
        "        pass\n"
        "@pytest.mark.timeout(300)\n"
        "def u(): pass\n"
    )
    assert unscaled(source) == [
        (2, "client.wait(...) on the library's 60 s default"),
        (3, "timeout=30"),
        (4, ".wait(10)"),
        (5, "within=5.0"),
        (9, "range(50) tries of a polling loop"),
        (20, "time.monotonic() - started < 25: a measured time under a literal limit"),
        (21, "took < 1.0: a measured time under a literal limit"),
        (23, "asyncio.timeout(20)"),
        (27, "pytest.mark.timeout(300)"),
    ]
