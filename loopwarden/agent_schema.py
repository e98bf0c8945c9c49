"""Generate ``schemas/agent.json``, the JSON Schema of agent files, from the ``Agent`` model.

An agent file (YAML or JSON, ``loopwarden agents register FILE``) may name it on its first line for
editors that speak yaml-language-server: ``# yaml-language-server: $schema=../schemas/agent.json``.
``make schemas`` writes it; a test fails when the model and the file disagree.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from loopwarden.data import schemas_dir

NAME = "agent.json"


def render() -> str:
    from shared.messages import Agent

    schema: dict[str, Any] = Agent.model_json_schema(by_alias=True, mode="validation")
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://loopwarden.dev/schemas/agent.json",
        "title": "Loopwarden agent",
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
