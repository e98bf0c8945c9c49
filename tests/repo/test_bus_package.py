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
