"""Every setting is documented: each field of the one settings object (``shared/settings/``) has its
environment variable in a row of docs/operations.md's Configuration tables (operator day 4: LW_NATS_USER and
LW_NATS_PASSWORD were missing)."""

from __future__ import annotations

import re

from shared.settings import Settings, env_name
from tests.support.paths import ROOT


def documented() -> set[str]:
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`([A-Z][A-Z0-9_]*)`", row.split(" | ")[0])}


def test_every_setting_is_in_the_operations_tables() -> None:
    names = documented()
    missing = [
        env_name(field)
        for field in Settings.model_fields
        if not any(choice.strip() in names for choice in env_name(field).split(" or "))
    ]
    assert not missing, f"settings missing from docs/operations.md's Configuration tables: {missing}"


def test_the_tables_name_no_setting_that_does_not_exist() -> None:
    known = {choice.strip() for field in Settings.model_fields for choice in env_name(field).split(" or ")}
    known |= {"NATS_URL", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"}  # read by the server or the SDK
    stray = sorted(n for n in documented() if n not in known and n.startswith(("LW_", "OTEL_", "NATS_")))
    assert not stray, f"docs/operations.md documents settings that do not exist: {stray}"
