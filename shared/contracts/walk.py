"""Where subschemas live in a JSON Schema: the one walker the dialect check, closing and lint share.

Property *names* are not keywords and ``enum``/``const``/``default`` values are data, so a
schema is walked by keyword: single subschemas, maps of them, arrays of them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

SCHEMA_VALUED = frozenset(
    {
        "additionalProperties",
        "additionalItems",
        "contains",
        "propertyNames",
        "not",
        "if",
        "then",
        "else",
        "unevaluatedItems",
        "unevaluatedProperties",
        "contentSchema",
    }
)
SCHEMA_MAPS = frozenset({"properties", "patternProperties", "definitions", "$defs", "dependentSchemas"})
SCHEMA_ARRAYS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})


def pointer(base: str, *parts: object) -> str:
    """A JSON pointer extended by ``parts`` (escaping ``~`` and ``/``)."""
    out = base
    for part in parts:
        out += "/" + str(part).replace("~", "~0").replace("/", "~1")
    return out


def children(node: dict[str, Any]) -> Iterator[tuple[str, tuple[object, ...], Any]]:
    """Each direct subschema of ``node`` as (keyword, pointer parts, subschema)."""
    for key, value in node.items():
        if key in SCHEMA_VALUED or (key == "items" and not isinstance(value, list)):
            yield key, (key,), value
        elif key in SCHEMA_MAPS and isinstance(value, dict):
            for name, sub in value.items():
                yield key, (key, name), sub
        elif (key in SCHEMA_ARRAYS or key == "items") and isinstance(value, list):
            for i, sub in enumerate(value):
                yield key, (key, i), sub
        elif key == "dependencies" and isinstance(value, dict):  # draft-07: schema or list of names
            for name, sub in value.items():
                if isinstance(sub, dict | bool):
                    yield key, (key, name), sub
