"""Schema dialect checks: a tool's schema is refused at registration, never silently ignored.

JSON Schema draft-07, 2019-09 and 2020-12 are different languages: ``definitions`` vs
``$defs``, array-form ``items``/``additionalItems`` vs ``prefixItems``, ``dependencies``
vs ``dependentRequired``/``dependentSchemas``, ``unevaluated*``. A validator given a keyword
its dialect does not define ignores it, so a schema that mixes dialects *looks* strict and
checks nothing. This module walks the schema the way its dialect reads it and refuses any
keyword the dialect does not define, naming the keyword and its JSON path.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

from jsonschema import FormatChecker
from jsonschema import exceptions as js_exceptions
from jsonschema import validators as js_validators

from shared.contracts.ecma import is_regex, pattern_problem
from shared.contracts.refs import Resources, index, resolve
from shared.contracts.walk import children
from shared.contracts.walk import pointer as _pointer

DIALECT_URIS: dict[str, str] = {
    "http://json-schema.org/draft-07/schema": "draft-07",
    "https://json-schema.org/draft-07/schema": "draft-07",
    "https://json-schema.org/draft/2019-09/schema": "2019-09",
    "https://json-schema.org/draft/2020-12/schema": "2020-12",
}
META_URI = {
    "draft-07": "http://json-schema.org/draft-07/schema#",
    "2019-09": "https://json-schema.org/draft/2019-09/schema",
    "2020-12": "https://json-schema.org/draft/2020-12/schema",
}
EXTENSION_PREFIX = "x-"  # vendor extensions (e.g. x-loopwarden-open) are allowed and inert

# draft-07 has no "deprecated", but it is an annotation like readOnly (2019-09 names it so): inert, allowed.
_ANNOTATIONS = {"$comment", "title", "description", "default", "examples", "readOnly", "writeOnly", "deprecated"}
_COMMON = _ANNOTATIONS | {
    "$schema",
    "$id",
    "$ref",
    "type",
    "enum",
    "const",
    "format",
    "multipleOf",
    "maximum",
    "exclusiveMaximum",
    "minimum",
    "exclusiveMinimum",
    "maxLength",
    "minLength",
    "pattern",
    "items",
    "maxItems",
    "minItems",
    "uniqueItems",
    "contains",
    "maxProperties",
    "minProperties",
    "required",
    "properties",
    "patternProperties",
    "additionalProperties",
    "propertyNames",
    "if",
    "then",
    "else",
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "contentMediaType",
    "contentEncoding",
}
_MODERN = {
    "$anchor",
    "$vocabulary",
    "$defs",
    "dependentRequired",
    "dependentSchemas",
    "unevaluatedItems",
    "unevaluatedProperties",
    "maxContains",
    "minContains",
    "deprecated",
    "contentSchema",
}
KEYWORDS: dict[str, frozenset[str]] = {
    "draft-07": frozenset(_COMMON | {"definitions", "dependencies", "additionalItems"}),
    "2019-09": frozenset(_COMMON | _MODERN | {"additionalItems", "$recursiveRef", "$recursiveAnchor"}),
    "2020-12": frozenset(_COMMON | _MODERN | {"prefixItems", "$dynamicRef", "$dynamicAnchor"}),
}
# Where reusable subschemas are kept. Either container works in any dialect ($ref is a JSON
# pointer, and both engines resolve it the same way), so one alone is allowed (lint notes
# the legacy one); both in one schema is a mixed dialect and is refused.
NATIVE_CONTAINER = {"draft-07": "definitions", "2019-09": "$defs", "2020-12": "$defs"}
_CONTAINER_OK: dict[str, frozenset[str]] = {
    "draft-07": frozenset({"$defs"}),
    "2019-09": frozenset({"definitions"}),
    "2020-12": frozenset({"definitions"}),
}
# Where a keyword of one dialect lives in another, say what to write instead.
_HINTS: dict[tuple[str, str], str] = {
    ("definitions", "modern"): "'definitions' is draft-07; this dialect uses '$defs'",
    ("dependencies", "modern"): "'dependencies' is draft-07; use 'dependentRequired' or 'dependentSchemas'",
    ("additionalItems", "2020-12"): "'additionalItems' was removed in 2020-12; use 'items' after 'prefixItems'",
    ("prefixItems", "old"): "'prefixItems' is 2020-12; this dialect uses array-form 'items'",
    ("$defs", "draft-07"): "'$defs' is 2019-09+; draft-07 uses 'definitions'",
    ("$dynamicRef", "old"): "'$dynamicRef' is 2020-12",
    ("$dynamicAnchor", "old"): "'$dynamicAnchor' is 2020-12",
    ("$recursiveRef", "other"): "'$recursiveRef' is 2019-09 only",
    ("$recursiveAnchor", "other"): "'$recursiveAnchor' is 2019-09 only",
}
_REF_SIBLING_OK = _ANNOTATIONS | {"$ref", "$id", "$schema", "definitions", "$defs"}


@dataclass(frozen=True)
class SchemaProblem:
    keyword: str
    path: str  # JSON pointer inside the schema, e.g. "#/properties/items/prefixItems"
    message: str


class ContractError(ValueError):
    """A tool contract that cannot be registered: names the tool, keyword and path."""

    def __init__(self, tool: str, which: str, problem: SchemaProblem) -> None:
        self.tool, self.which, self.problem = tool, which, problem
        super().__init__(f"tool '{tool}' {which}: {problem.message} (keyword '{problem.keyword}' at {problem.path})")


def dialect_of(schema: Any, default: str) -> str:
    """The dialect a schema declares with ``$schema``, or ``default``."""
    if not isinstance(schema, dict) or "$schema" not in schema:
        return default
    uri = str(schema["$schema"]).rstrip("#")
    if uri not in DIALECT_URIS:
        raise _Refusal(
            SchemaProblem(
                "$schema",
                "#/$schema",
                f"unsupported dialect {schema['$schema']!r}; use draft-07, 2019-09 or 2020-12",
            )
        )
    return DIALECT_URIS[uri]


class _Refusal(Exception):
    def __init__(self, problem: SchemaProblem) -> None:
        super().__init__(problem.message)
        self.problem = problem


def check_schema(schema: Any, default_dialect: str) -> tuple[str, list[SchemaProblem]]:
    """Return the schema's dialect and every problem that must stop registration."""
    try:
        dialect = dialect_of(schema, default_dialect)
    except _Refusal as refusal:
        return default_dialect, [refusal.problem]
    if not isinstance(schema, dict):
        return dialect, [SchemaProblem("type", "#", "a tool schema must be a JSON object")]
    problems = list(_walk(schema, "#", dialect, root=schema, res=index(schema)))
    problems.extend(_mixed_containers(schema, dialect))
    if not problems:
        problems.extend(_meta_problems(schema, dialect))
    return dialect, problems


def _walk(node: Any, path: str, dialect: str, *, root: dict[str, Any], res: Resources) -> Iterator[SchemaProblem]:
    if isinstance(node, bool):
        return
    if not isinstance(node, dict):
        yield SchemaProblem("(schema)", path, f"a subschema must be an object or boolean, got {type(node).__name__}")
        return
    allowed = KEYWORDS[dialect] | _CONTAINER_OK[dialect]
    for key in node:
        if key.startswith(EXTENSION_PREFIX):
            continue
        if key not in allowed:
            yield SchemaProblem(key, _pointer(path, key), _foreign_message(key, dialect))
    if dialect == "draft-07" and "$ref" in node:
        ignored = sorted(k for k in node if k not in _REF_SIBLING_OK and not k.startswith(EXTENSION_PREFIX))
        if ignored:
            yield SchemaProblem(
                ignored[0],
                _pointer(path, ignored[0]),
                f"in draft-07 every keyword beside '$ref' is ignored ({', '.join(ignored)}); wrap them in 'allOf'",
            )
    if "items" in node and isinstance(node["items"], list) and dialect == "2020-12":
        yield SchemaProblem(
            "items",
            _pointer(path, "items"),
            "array-form 'items' is draft-07/2019-09; in 2020-12 use 'prefixItems' for tuples",
        )
    ref = node.get("$ref")
    if isinstance(ref, str):
        yield from _check_ref(ref, path, res)
    nested = node.get("$schema")
    if path != "#" and isinstance(nested, str) and DIALECT_URIS.get(nested.rstrip("#")) != dialect:
        yield SchemaProblem(
            "$schema",
            _pointer(path, "$schema"),
            f"a subschema declaring {nested!r} inside a {dialect} schema mixes dialects",
        )
    for pattern_path, pattern in _patterns(node, path):
        problem = pattern_problem(pattern)
        if problem:
            yield SchemaProblem("pattern", pattern_path, problem)

    for key, parts, sub in children(node):
        if not key.startswith(EXTENSION_PREFIX) and key in allowed:
            yield from _walk(sub, _pointer(path, *parts), dialect, root=root, res=res)


def _mixed_containers(schema: dict[str, Any], dialect: str) -> Iterator[SchemaProblem]:
    """``definitions`` and ``$defs`` in one schema: refuse at the first one foreign to the dialect."""
    found: dict[str, list[str]] = {"definitions": [], "$defs": []}

    def visit(node: Any, path: str) -> None:
        if not isinstance(node, dict):
            return
        for container in found:
            if isinstance(node.get(container), dict):
                found[container].append(_pointer(path, container))
        for _, parts, sub in children(node):
            visit(sub, _pointer(path, *parts))

    visit(schema, "#")
    if found["definitions"] and found["$defs"]:
        native = NATIVE_CONTAINER[dialect]
        foreign = "$defs" if native == "definitions" else "definitions"
        yield SchemaProblem(
            foreign,
            found[foreign][0],
            f"'{foreign}' beside '{native}' mixes dialects (schema dialect is {dialect}); keep '{native}'",
        )


def _patterns(node: dict[str, Any], path: str) -> Iterator[tuple[str, str]]:
    if isinstance(node.get("pattern"), str):
        yield _pointer(path, "pattern"), node["pattern"]
    if isinstance(node.get("patternProperties"), dict):
        for pat in node["patternProperties"]:
            yield _pointer(path, "patternProperties", pat), pat


def _foreign_message(key: str, dialect: str) -> str:
    family = "modern" if dialect in ("2019-09", "2020-12") else "old"
    for scope in (dialect, family, "other"):
        hint = _HINTS.get((key, scope))
        if hint:
            return f"{hint} (schema dialect is {dialect})"
    owners = [d for d, kws in KEYWORDS.items() if key in kws]
    if owners:
        return f"'{key}' belongs to {', '.join(owners)}, not {dialect}; it would be silently ignored"
    return (
        f"unknown keyword '{key}' in a {dialect} schema would be silently ignored (use an 'x-' prefix for annotations)"
    )


def _check_ref(ref: str, holder: str, res: Resources) -> Iterator[SchemaProblem]:
    found = resolve(res, ref, holder)
    if found.remote:
        yield SchemaProblem(
            "$ref",
            _pointer(holder, "$ref"),
            f"remote $ref {ref!r} is not allowed; contracts must be self-contained",
        )
    elif found.problem:
        yield SchemaProblem("$ref", _pointer(holder, "$ref"), found.problem)


@cache
def _meta_checker(dialect: str) -> FormatChecker:
    """The dialect's own format checks for its meta-schema, with ECMA-262 for "regex"."""
    cls = js_validators.validator_for({"$schema": META_URI[dialect]})
    checker = FormatChecker(formats=())
    checker.checkers = dict(cls.FORMAT_CHECKER.checkers)
    checker.checks("regex")(lambda value: not isinstance(value, str) or is_regex(value))
    return checker


def _meta_problems(schema: dict[str, Any], dialect: str) -> Iterator[SchemaProblem]:
    cls = js_validators.validator_for({"$schema": META_URI[dialect]})
    try:
        cls.check_schema(schema, format_checker=_meta_checker(dialect))
    except js_exceptions.SchemaError as err:
        where = "#" + "".join(f"/{p}" for p in err.path)
        keyword = str(err.path[-1]) if err.path else str(err.validator)
        yield SchemaProblem(keyword, where, f"not a valid {dialect} schema: {err.message}")
