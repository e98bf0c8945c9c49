"""Softer contract problems: the schema works, but the model will guess where it should not.

Schemas are part of the prompt. An open object lets the model invent fields; a free
string for a category invites typos an enum would have prevented; a field without a
description leaves its meaning to guesswork; an object without ``required`` cannot say
what is essential.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from shared.contracts.closing import OPEN_MARKER
from shared.contracts.dialect import NATIVE_CONTAINER, dialect_of
from shared.contracts.formats import SUPPORTED_FORMATS
from shared.contracts.walk import children, pointer
from shared.messages import ToolContract

_CATEGORY_NAMES = re.compile(
    r"(^|_)(status|state|type|kind|priority|level|category|mode|severity|channel|role|stage|tier)$", re.I
)


@dataclass(frozen=True)
class LintIssue:
    tool: str
    schema: str
    path: str
    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.tool} {self.schema} {self.path}: [{self.code}] {self.message}"


def lint_contract(
    contract: ToolContract, declared: dict[str, dict[str, Any]] | None = None, default_dialect: str = "2020-12"
) -> list[LintIssue]:
    """Lint the schemas as *declared* (before closing), so an open object is seen as open."""
    issues: list[LintIssue] = []
    schemas = declared or {"inputSchema": contract.input_schema, "outputSchema": contract.output_schema}
    for which, schema in schemas.items():
        for path, code, message in _lint(schema, "#", which == "inputSchema", name=None):
            issues.append(LintIssue(contract.name, which, path, code, message))
        try:
            native = NATIVE_CONTAINER[dialect_of(schema, default_dialect)]
        except Exception:  # an unsupported dialect is a registration error, not a lint note
            continue
        legacy = "definitions" if native == "$defs" else "$defs"
        if legacy in schema and native not in schema:
            issues.append(
                LintIssue(
                    contract.name,
                    which,
                    f"#/{legacy}",
                    "legacy-container",
                    f"'{legacy}' works, but this dialect's own name for it is '{native}'",
                )
            )
    if len(contract.description) < 20:
        issues.append(
            LintIssue(
                contract.name, "description", "#", "short-description", "say what the tool does and when not to use it"
            )
        )
    return issues


def _lint(node: Any, path: str, is_input: bool, name: str | None) -> Iterator[tuple[str, str, str]]:
    if not isinstance(node, dict) or node.get(OPEN_MARKER) is True:
        return
    types = node.get("type")
    types = types if isinstance(types, list) else [types]
    if "object" in types:
        if "properties" not in node and "additionalProperties" not in node and "patternProperties" not in node:
            yield path, "open-object", "object with no properties and no explicit additionalProperties accepts anything"
        if "properties" in node and "required" not in node:
            yield path, "no-required", "object lists properties but none is required; say which are essential"
    if "string" in types and name and _CATEGORY_NAMES.search(name):
        if not any(k in node for k in ("enum", "const", "pattern", "format")):
            yield path, "string-should-be-enum", f"'{name}' looks like a category; declare its values with enum"
    fmt = node.get("format")
    if isinstance(fmt, str) and fmt not in SUPPORTED_FORMATS:
        yield path, "unchecked-format", f"format '{fmt}' is an annotation here: nothing checks it"
    if is_input and name and "description" not in node and "$ref" not in node:
        yield path, "no-description", f"'{name}' has no description; the model reads it as instructions"
    for key, parts, sub in children(node):
        # a property's own name travels down; items inherit the array's name; definitions have none
        child_name = str(parts[1]) if key == "properties" else (name if key in ("items", "prefixItems") else None)
        yield from _lint(sub, pointer(path, *parts), is_input, child_name)
