"""Closed objects by default.

An object schema that lists ``properties`` and says nothing about extra fields is treated
as ``additionalProperties: false``: a field the tool (or the model) invents is caught here
instead of flowing on to break something far away. Opt-outs, for wrapped third-party APIs:

* ``"additionalProperties": true`` (or any explicit value) on one object;
* ``"x-loopwarden-open": true`` on a schema opens it and its whole subtree.

Branches of ``allOf`` are left alone (closing each branch would reject the others'
fields); in 2019-09/2020-12 the object that holds the ``allOf`` is closed with
``unevaluatedProperties: false`` instead, which sees through the composition.
"""

from __future__ import annotations

import copy
from typing import Any

from shared.contracts.walk import children, pointer

OPEN_MARKER = "x-loopwarden-open"


def close_schema(schema: dict[str, Any], dialect: str) -> dict[str, Any]:
    """A copy of ``schema`` with undeclared extra fields refused, except where opted out."""
    out = copy.deepcopy(schema)
    composed = set(_refs_in_all_of(out))
    _close(out, "#", dialect, in_all_of=False, composed=composed)
    return out


def _refs_in_all_of(node: Any) -> list[str]:
    """Pointers that are ``allOf`` members by reference: closing them would break the composition."""
    found: list[str] = []
    if isinstance(node, dict):
        for branch in node.get("allOf", []) if isinstance(node.get("allOf"), list) else []:
            if isinstance(branch, dict) and isinstance(branch.get("$ref"), str):
                found.append(branch["$ref"])
        for value in node.values():
            found.extend(_refs_in_all_of(value))
    elif isinstance(node, list):
        for item in node:
            found.extend(_refs_in_all_of(item))
    return found


def _close(node: Any, path: str, dialect: str, *, in_all_of: bool, composed: set[str]) -> None:
    if not isinstance(node, dict) or node.get(OPEN_MARKER) is True:
        return
    in_all_of = in_all_of or path in composed
    declares_fields = "properties" in node or "patternProperties" in node
    explicit = "additionalProperties" in node or "unevaluatedProperties" in node
    if declares_fields and not explicit and not in_all_of and "allOf" not in node:
        node["additionalProperties"] = False
    if "allOf" in node and not explicit and not in_all_of and dialect != "draft-07" and _has_fields(node):
        node["unevaluatedProperties"] = False

    for key, parts, sub in children(node):
        _close(sub, pointer(path, *parts), dialect, in_all_of=key == "allOf", composed=composed)


def _has_fields(node: dict[str, Any]) -> bool:
    if "properties" in node:
        return True
    return any(isinstance(b, dict) and ("properties" in b or "$ref" in b) for b in node.get("allOf", []))
