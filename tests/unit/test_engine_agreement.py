"""The fast engine (pass/fail) and the explaining engine must agree, on any instance, in every dialect."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.contracts.closing import close_schema
from shared.contracts.dialect import check_schema
from shared.contracts.validation import compiled

D7 = "http://json-schema.org/draft-07/schema#"
D19 = "https://json-schema.org/draft/2019-09/schema"

SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {
            "priority": {"enum": ["low", "medium", "high"]},
            "n": {"type": "integer", "minimum": 0, "exclusiveMaximum": 10},
            "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        },
        "required": ["priority"],
    },
    {
        "type": "object",
        "oneOf": [
            {"properties": {"status": {"const": "ok"}, "v": {"type": "number"}}, "required": ["status", "v"]},
            {"properties": {"status": {"const": "not_found"}}, "required": ["status"]},
        ],
    },
    {
        "type": "object",
        "properties": {
            "when": {"type": "string", "format": "date-time"},
            "day": {"type": "string", "format": "date"},
            "url": {"type": "string", "format": "uri"},
            "id": {"type": "string", "format": "uuid"},
            "ip": {"type": "string", "format": "ipv4"},
            "mail": {"type": "string", "format": "email"},
            "dur": {"type": "string", "format": "duration"},
            "ptr": {"type": "string", "format": "json-pointer"},
            "ref": {"type": "string", "format": "uri-reference"},
            "odd": {"type": "string", "format": "int32"},
        },
    },
    {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False, "minItems": 1},
    {
        "type": "object",
        "$defs": {"pos": {"type": "number", "minimum": 0}},
        "properties": {"a": {"$ref": "#/$defs/pos"}, "b": {"type": "string", "pattern": "^[a-z]{2,4}$"}},
        "dependentRequired": {"a": ["b"]},
    },
    {
        "type": "object",
        "if": {"properties": {"kind": {"const": "x"}}, "required": ["kind"]},
        "then": {"required": ["x"]},
        "else": {"not": {"required": ["x"]}},
    },
    {
        "type": "object",
        "allOf": [
            {"properties": {"a": {"type": "string"}}, "required": ["a"]},
            {"properties": {"b": {"type": "integer"}}},
        ],
    },
    {
        "$schema": D7,
        "type": "object",
        "definitions": {"s": {"type": "string", "maxLength": 3}},
        "properties": {"t": {"type": "array", "items": [{"$ref": "#/definitions/s"}], "additionalItems": False}},
        "dependencies": {"t": ["u"]},
    },
    {
        "$schema": D19,
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "unevaluatedProperties": False,
        "minProperties": 1,
        "maxProperties": 3,
    },
    {"type": ["string", "null"], "minLength": 2, "maxLength": 5},
    {"type": "number", "multipleOf": 0.5, "minimum": -2},
    # ECMA-262 patterns (issue 9, item 7): Unicode property escapes, named groups, ASCII \d and \w
    {
        "type": "object",
        "properties": {
            "a": {"type": "string", "pattern": "^\\p{Letter}+$"},
            "b": {"type": "string", "pattern": "^(?<y>\\d{4})-(?<m>\\d{2})$"},
            "x": {"type": "string", "pattern": "^\\w+\\s?\\S*$"},
            "kind": {"type": "string", "pattern": "^[^.]+\\.$|^.$"},
        },
        "patternProperties": {"^\\p{Lu}": {"type": "integer"}, "^[0-9]+$": {"type": "string"}},
    },
    {"type": "string", "format": "regex"},
    {
        "type": "object",
        "properties": {
            "when": {"type": "string", "format": "time"},
            "id": {"type": "string", "format": "uuid"},
            "day": {"type": "string", "format": "date"},
            "mail": {"type": "string", "format": "email"},
        },
    },
    # refs: percent-encoded fragments, escaped keys, the schema's own $id (issue 9, item 7)
    {
        "$id": "https://example.com/catalog-info.json",
        "type": "object",
        "$defs": {"[a-z]+": {"type": "string"}, "n/m": {"type": "integer"}},
        "properties": {
            "a": {"$ref": "#/$defs/%5Ba-z%5D%2B"},
            "n": {"$ref": "catalog-info.json#/$defs/n~1m"},
        },
    },
    # compositions that closing must leave strict (issue 9, item 6)
    {
        "type": "object",
        "properties": {"status": {"type": "string"}, "x": {}},
        "not": {"properties": {"status": {"const": "not_found"}}, "required": ["status"]},
        "if": {"properties": {"kind": {"const": "x"}}, "required": ["kind"]},
        "then": {"required": ["x"]},
    },
    {
        "type": "object",
        "properties": {"a": {"type": "string"}},
        "anyOf": [{"properties": {"b": {"type": "integer"}}, "required": ["b"]}, {"required": ["a"]}],
        "dependentSchemas": {"a": {"properties": {"kind": {"enum": ["x", "low"]}}}},
        "unevaluatedProperties": False,
    },
    {
        "$schema": D7,
        "type": "object",
        "properties": {"a": {"type": "string", "deprecated": True}},
        "oneOf": [{"properties": {"b": {"type": "integer"}}, "required": ["b"]}, {"required": ["a"]}],
    },
    {"type": "object", "properties": {"a": {"allOf": [False, {"type": "string"}]}, "b": False}},
]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-20, 20)
    | st.floats(-10, 10, allow_nan=False)
    | st.sampled_from(
        [
            "",
            "x",
            "ok",
            "low",
            "high",
            "not_found",
            "2024-02-30",
            "2024-02-29T10:00:00Z",
            "https://x.y/z",
            "no uri",
            "192.168.0.1",
            "01.2.3.4",
            "a@b",
            "ab",
            "abcdef",
            "123e4567-e89b-12d3-a456-426614174000",
            "P3D",
            "PT",
            "/a/b~1c",
            "a b",
            "kind",
            "x",
            "Émile",
            "서울",
            "R2D2",
            "2024-05",
            "২০২৪-05",
            "abc_1 é",
            "٣",
            "a.",
            "\u2028",
            "12:34:56Z",
            "12:3\u09ea:56Z",
            "12:34:56Z\n",
            "123e4567-e89b-12d3-a456-426614174000\n",
            "a@b\n",
            "^\\p{Letter}(?<n>.)$",
            "(?P<n>x)",
            "[",
            "\\d+",
        ]
    ),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "priority",
                    "n",
                    "tags",
                    "status",
                    "v",
                    "when",
                    "day",
                    "url",
                    "id",
                    "ip",
                    "mail",
                    "dur",
                    "ptr",
                    "ref",
                    "odd",
                    "a",
                    "b",
                    "kind",
                    "x",
                    "t",
                    "u",
                    "extra",
                    "Ärger",
                    "ärger",
                    "42",
                    "deprecated",
                ]
            ),
            children,
            max_size=5,
        )
    ),
    max_leaves=12,
)


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(SCHEMAS)))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instance=json_values)
def test_fast_and_explaining_engines_agree(index: int, instance: Any) -> None:
    schema = SCHEMAS[index]
    dialect, problems = check_schema(schema, "2020-12")
    assert not problems, problems
    v = compiled(close_schema(schema, dialect), dialect)
    assert v.is_valid(instance) == (not v.raw_errors(instance))
    if not v.is_valid(instance):
        assert v.errors(instance)  # a failure always comes with an explanation
