"""Generate ``schemas/scenario.json``, the JSON Schema of scenario files, from the ``Scenario`` model.

Editors that speak yaml-language-server validate a scenario against it (the shipped ones name it
on their first line: ``# yaml-language-server: $schema=../schemas/scenario.json``; ``.vscode/
settings.json`` maps ``scenarios/*.yaml`` to it). ``make schemas`` writes it; a test fails when the
model and the file disagree. What a schema cannot say (a turn needs text, tool calls or an error;
ids unique in a turn) is still checked by ``loopwarden check-scenario``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from loopwarden.data import schemas_dir

NAME = "scenario.json"


def render() -> str:
    from shared.scenario import Scenario

    schema: dict[str, Any] = Scenario.model_json_schema(by_alias=True, mode="validation")
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://loopwarden.dev/schemas/scenario.json",
        "title": "Loopwarden scenario",
        **{k: v for k, v in schema.items() if k != "title"},
    }
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main() -> int:
    path = schemas_dir() / NAME
    path.write_text(render())
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
