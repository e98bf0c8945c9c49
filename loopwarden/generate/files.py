"""Generate the JSON Schemas of the files a user writes, from their models: ``schemas/scenario.json``
(``Scenario``), ``schemas/agent.json`` (``Agent``) and ``schemas/access.json`` (``AccessFile``, the tenants and
operators an admin applies).

Editors that speak yaml-language-server validate a file against its schema (the shipped scenarios name
it on their first line: ``# yaml-language-server: $schema=../schemas/scenario.json``; ``.vscode/
settings.json`` maps ``scenarios/*.yaml`` to it; an agent file may name ``../schemas/agent.json``).
``make schemas`` writes them; a test fails when a model and its file disagree. What a schema cannot say
(a turn needs text, tool calls or an error; ids unique in a turn) is still checked by ``loopwarden
check-scenario`` and ``loopwarden agents register``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from loopwarden.generate import SCHEMAS

TITLES = {
    "scenario.json": "Loopwarden scenario",
    "agent.json": "Loopwarden agent",
    "access.json": "Loopwarden access file (tenants and operators)",
}


def _model(name: str) -> Any:
    if name == "scenario.json":
        from shared.scenario import Scenario

        return Scenario
    if name == "access.json":
        from shared.access import AccessFile

        return AccessFile
    from shared.messages import Agent

    return Agent


def render(name: str) -> str:
    """The schema file ``name`` (a key of ``TITLES``) as ``make schemas`` writes it."""
    schema: dict[str, Any] = _model(name).model_json_schema(by_alias=True, mode="validation")
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://loopwarden.dev/schemas/{name}",
        "title": TITLES[name],
        **{k: v for k, v in schema.items() if k != "title"},
    }
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write() -> list[Path]:
    written = []
    for name in TITLES:
        path = SCHEMAS / name
        path.write_text(render(name))
        written.append(path)
    return written
