"""The bus is a package behind one face: every name importers use comes from ``shared.bus``, each part is
one concept of a readable size, and no part knows about scenarios (a test double's format)."""

from __future__ import annotations

import ast
from pathlib import Path

import shared.bus

PACKAGE = Path(shared.bus.__file__).parent

# What modules, tests and benches import from ``shared.bus`` (and what the single module offered).
FACE = (
    "Bus CasConflict ConsumerSpec InfrastructureNotReady MSG_ID_HEADER RUN_ID_HEADER RequestRefused Stored "
    "TryLater Unchanged ack_consumer current_deliveries current_subject ensure_buckets ensure_consumers "
    "ensure_streams kv_history kv_keys kv_scan num_delivered publish_raw scan scan_all scan_page stream_config "
    "until_ready consumer_config consumer_drift decode describe_nats_error"
).split()


def test_every_name_importers_use_is_on_the_face() -> None:
    missing = [name for name in FACE if not hasattr(shared.bus, name)]
    assert not missing, f"shared.bus no longer offers {missing}"
    assert set(FACE) <= set(shared.bus.__all__)


def test_each_part_is_one_readable_module() -> None:
    sizes = {p.name: len(p.read_text().splitlines()) for p in PACKAGE.glob("*.py")}
    assert all(n <= 500 for n in sizes.values()), sizes


def test_no_part_of_the_bus_imports_the_scenario_format() -> None:
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert node.module not in ("shared.scenario", "shared.providers.scripted"), path.name
                assert not (node.module or "").startswith("services"), path.name


def imports_among_parts() -> dict[str, set[str]]:
    """Each part of the bus (``__init__`` for the face) and the parts it imports: every import statement, at the
    top, in a function or under ``TYPE_CHECKING`` alike; ``from shared.bus import natsx`` is the part ``natsx``."""
    parts = {p.stem for p in PACKAGE.glob("*.py")}

    def part(module: str) -> str | None:
        if module == "shared.bus":
            return "__init__"
        name = module.removeprefix("shared.bus.").split(".")[0]
        return name if module.startswith("shared.bus.") and name in parts else None

    graph: dict[str, set[str]] = {}
    for path in PACKAGE.glob("*.py"):
        found: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {part(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = ("shared.bus" + (f".{node.module}" if node.module else "")) if node.level else node.module or ""
                if base == "shared.bus":  # a part by name, or a name off the face
                    found |= {alias.name if alias.name in parts else "__init__" for alias in node.names}
                else:
                    found.add(part(base))
        graph[path.stem] = {name for name in found if name is not None} - {path.stem}
    return graph


def circle(graph: dict[str, set[str]]) -> list[str]:
    """A circle of imports in ``graph`` (its modules in order, the first repeated at the end), or []."""
    done: set[str] = set()

    def walk(node: str, path: list[str]) -> list[str]:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return []
        for nxt in sorted(graph.get(node, ())):
            found = walk(nxt, [*path, node])
            if found:
                return found
        done.add(node)
        return []

    for start in sorted(graph):
        found = walk(start, [])
        if found:
            return found
    return []


def test_the_circle_finder_finds_one() -> None:
    assert circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert circle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_no_part_of_the_bus_imports_one_that_imports_it() -> None:
    """Each part stands on the ones below it, typing imports included: a part declares its own state and is
    handed what it needs (a pull consumer its delivery, locks and span), so nothing reaches back up."""
    graph = imports_among_parts()
    assert graph["consuming"] >= {"pulls", "letters"} and graph["__init__"] >= {"connection"}  # the parse sees them
    assert not circle(graph), " -> ".join(circle(graph))
