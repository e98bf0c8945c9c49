"""Registration checks, closing by default, model-readable errors, repairs."""

from __future__ import annotations

from typing import Any

import pytest

from shared.contracts.closing import close_schema
from shared.contracts.dialect import ContractError
from shared.contracts.lint import lint_contract
from shared.contracts.registration import register_contract
from shared.contracts.repair import apply_repairs
from shared.contracts.validation import compiled
from shared.messages import RepairRule, ToolContract

D7 = "http://json-schema.org/draft-07/schema#"
D19 = "https://json-schema.org/draft/2019-09/schema"
D20 = "https://json-schema.org/draft/2020-12/schema"
OUT = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}


def contract(inp: dict[str, Any], out: dict[str, Any] | None = None, **kw: Any) -> ToolContract:
    return ToolContract.model_validate(
        {"name": "t", "description": "a tool used in tests only", "inputSchema": inp, "outputSchema": out or OUT, **kw}
    )


def refusal(inp: dict[str, Any]) -> ContractError:
    with pytest.raises(ContractError) as err:
        register_contract(contract(inp))
    return err.value


@pytest.mark.parametrize(
    ("schema", "keyword", "path"),
    [
        (
            {"$schema": D7, "type": "object", "properties": {"a": {"type": "array", "prefixItems": [{}]}}},
            "prefixItems",
            "#/properties/a/prefixItems",
        ),
        (
            {"$schema": D7, "type": "object", "unevaluatedProperties": False},
            "unevaluatedProperties",
            "#/unevaluatedProperties",
        ),
        (
            {"$schema": D7, "type": "object", "definitions": {"a": {}}, "properties": {"p": {"$defs": {"x": {}}}}},
            "$defs",
            "#/properties/p/$defs",
        ),
        (
            {"$schema": D7, "type": "object", "properties": {"a": {"type": "object", "dependentRequired": {}}}},
            "dependentRequired",
            "#/properties/a/dependentRequired",
        ),
        (
            {"$schema": D20, "type": "object", "properties": {"a": {"type": "array", "items": [{"type": "string"}]}}},
            "items",
            "#/properties/a/items",
        ),
        (
            {"$schema": D20, "type": "object", "properties": {"a": {"type": "array", "additionalItems": False}}},
            "additionalItems",
            "#/properties/a/additionalItems",
        ),
        (
            {"$schema": D20, "type": "object", "$defs": {"a": {"$ref": "#/definitions/x"}}, "definitions": {"x": {}}},
            "definitions",
            "#/definitions",
        ),
        ({"$schema": D20, "type": "object", "dependencies": {"a": ["b"]}}, "dependencies", "#/dependencies"),
        (
            {"$schema": D19, "type": "object", "properties": {"a": {"type": "array", "prefixItems": [{}]}}},
            "prefixItems",
            "#/properties/a/prefixItems",
        ),
        ({"type": "object", "$defs": {"x": {}}, "definitions": {"y": {}}}, "definitions", "#/definitions"),
        (
            {"type": "object", "properties": {"a": {"type": "string", "nullable": True}}},
            "nullable",
            "#/properties/a/nullable",
        ),
        (
            {"type": "object", "properties": {"type": {"type": "string", "example": "x"}}},
            "example",
            "#/properties/type/example",
        ),
        (
            {
                "$schema": D7,
                "type": "object",
                "properties": {"a": {"$ref": "#/definitions/s", "minLength": 2}},
                "definitions": {"s": {"type": "string"}},
            },
            "minLength",
            "#/properties/a/minLength",
        ),
        (
            {"type": "object", "properties": {"a": {"$ref": "https://example.com/s.json"}}},
            "$ref",
            "#/properties/a/$ref",
        ),
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, "$ref", "#/properties/a/$ref"),
        (
            {"$schema": D20, "type": "object", "properties": {"a": {"$schema": D7, "type": "string"}}},
            "$schema",
            "#/properties/a/$schema",
        ),
        ({"type": "object", "properties": {"a": {"type": "strng"}}}, "type", "#/properties/a/type"),
        (
            {"type": "object", "properties": {"a": {"type": "string", "pattern": "(unclosed"}}},
            "pattern",
            "#/properties/a/pattern",
        ),
        ({"$schema": "http://json-schema.org/draft-04/schema#", "type": "object"}, "$schema", "#/$schema"),
        ({"type": "array"}, "type", "#/type"),
    ],
)
def test_registration_refuses_with_keyword_and_path(schema: dict[str, Any], keyword: str, path: str) -> None:
    err = refusal(schema)
    assert err.problem.keyword == keyword
    assert err.problem.path == path
    assert f"keyword '{keyword}' at {path}" in str(err) and "tool 't' inputSchema" in str(err)


@pytest.mark.parametrize(
    "schema",
    [
        {
            "$schema": D7,
            "type": "object",
            "definitions": {"s": {"type": "string"}},
            "properties": {
                "a": {"$ref": "#/definitions/s"},
                "t": {"type": "array", "items": [{"type": "string"}], "additionalItems": False},
            },
            "dependencies": {"a": ["t"]},
        },
        {
            "$schema": D19,
            "type": "object",
            "$defs": {"s": {"type": "string"}},
            "properties": {"a": {"$ref": "#/$defs/s", "minLength": 1}},
            "unevaluatedProperties": False,
            "dependentRequired": {"a": []},
        },
        {
            "$schema": D20,
            "type": "object",
            "$defs": {"s": {"type": "string"}},
            "properties": {
                "a": {"$ref": "#/$defs/s"},
                "t": {"type": "array", "prefixItems": [{"type": "string"}], "items": False},
            },
            "x-owner": "search-team",
        },
        {"type": "object", "properties": {"when": {"type": "string", "format": "date-time"}}},
    ],
)
def test_registration_accepts_each_dialect_in_its_own_words(schema: dict[str, Any]) -> None:
    assert register_contract(contract(schema)).fingerprint


@pytest.mark.parametrize(
    "schema",
    [
        {
            "$schema": D20,
            "type": "object",
            "definitions": {"s": {"type": "string"}},
            "properties": {"a": {"$ref": "#/definitions/s"}},
        },
        {
            "$schema": D7,
            "type": "object",
            "$defs": {"s": {"type": "string"}},
            "properties": {"a": {"$ref": "#/$defs/s"}},
        },
    ],
)
def test_a_lone_legacy_definitions_container_works_and_is_linted(schema: dict[str, Any]) -> None:
    registered = register_contract(contract(schema))
    v = compiled(registered.input_schema, registered.dialect or "")
    assert v.is_valid({"a": "x"}) and not v.is_valid({"a": 1})  # the $ref really is followed
    assert "legacy-container" in {i.code for i in lint_contract(contract(schema))}


def test_unknown_formats_are_annotations_and_known_ones_are_asserted() -> None:
    schema = {
        "type": "object",
        "properties": {
            "c": {"type": "string", "format": "colour"},
            "d": {"type": "string", "format": "duration"},
            "p": {"type": "string", "format": "json-pointer"},
        },
    }
    registered = register_contract(contract(schema))
    v = compiled(registered.input_schema, "2020-12")
    assert v.is_valid({"c": "not a colour at all", "d": "P3DT4H", "p": "/a/b~1c"})
    assert not v.is_valid({"d": "3 days"}) and not v.is_valid({"p": "a/b"})
    assert ("#/properties/c", "unchecked-format") in {(i.path, i.code) for i in lint_contract(contract(schema))}


def test_a_ref_to_an_embedded_id_is_not_remote() -> None:
    schema = {
        "$id": "https://example.com/root",
        "type": "object",
        "$defs": {
            "addr": {"$id": "https://example.com/address", "type": "object", "properties": {"city": {"type": "string"}}}
        },
        "properties": {"home": {"$ref": "https://example.com/address"}},
    }
    registered = register_contract(contract(schema))
    v = compiled(registered.input_schema, "2020-12")
    assert v.is_valid({"home": {"city": "Seoul"}}) and not v.is_valid({"home": {"city": 3}})


def test_output_schema_is_checked_too() -> None:
    with pytest.raises(ContractError) as err:
        register_contract(
            contract({"type": "object"}, {"$schema": D7, "type": "object", "properties": {"r": {"prefixItems": []}}})
        )
    assert "outputSchema" in str(err.value) and "#/properties/r/prefixItems" in str(err.value)


def test_unknown_repair_rule_is_refused() -> None:
    with pytest.raises(ContractError, match="unknown repair rule"):
        register_contract(contract({"type": "object"}, repairs=[{"path": "/x", "rule": "guess"}]))


# --- closed by default ---------------------------------------------------------------------------


def test_objects_are_closed_unless_they_opt_out() -> None:
    schema = {
        "type": "object",
        "properties": {
            "closed": {"type": "object", "properties": {"a": {"type": "string"}}},
            "explicit": {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": True},
            "vendor": {
                "type": "object",
                "x-loopwarden-open": True,
                "properties": {"inner": {"type": "object", "properties": {"a": {"type": "string"}}}},
            },
        },
    }
    v = compiled(close_schema(schema, "2020-12"), "2020-12")
    assert not v.is_valid({"closed": {"a": "x", "b": 1}})
    assert v.is_valid({"explicit": {"a": "x", "b": 1}})
    assert v.is_valid({"vendor": {"inner": {"a": "x", "extra": 1}, "more": 2}})
    assert not v.is_valid({"unknown_top_level": 1})


def test_closing_does_not_break_allof_composition() -> None:
    schema = {
        "$defs": {"base": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}},
        "allOf": [{"$ref": "#/$defs/base"}, {"properties": {"name": {"type": "string"}}}],
    }
    v = compiled(close_schema(schema, "2020-12"), "2020-12")
    assert v.is_valid({"id": "1", "name": "n"})
    assert not v.is_valid({"id": "1", "name": "n", "extra": True})  # closed through unevaluatedProperties


def test_not_found_variant_passes() -> None:
    hosted = register_contract(
        contract(
            {"type": "object"},
            {
                "oneOf": [
                    {
                        "type": "object",
                        "properties": {"status": {"const": "success"}, "items": {"type": "array"}},
                        "required": ["status", "items"],
                    },
                    {
                        "type": "object",
                        "properties": {"status": {"const": "not_found"}, "reason": {"type": "string"}},
                        "required": ["status", "reason"],
                    },
                ]
            },
        )
    )
    v = compiled(hosted.output_schema, "2020-12")
    assert v.is_valid({"status": "not_found", "reason": "no such order"})
    assert not v.is_valid({"status": "not_found"})


# --- errors a model can act on -------------------------------------------------------------------

TICKET = {
    "type": "object",
    "properties": {
        "priority": {"type": "string", "enum": ["low", "medium", "high", "urgent"]},
        "due_date": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"},
        "title": {"type": "string", "minLength": 3, "maxLength": 120},
        "count": {"type": "integer", "minimum": 1},
    },
    "required": ["title", "priority"],
}


def test_errors_say_where_what_was_expected_and_what_was_got() -> None:
    v = compiled(close_schema(TICKET, "2020-12"), "2020-12")
    errors = v.errors({"priority": "hi", "due_date": "tomorrow", "count": 0, "assignee": "me"})
    messages = [e.message for e in errors]
    assert "$.priority must be one of low, medium, high, urgent; got 'hi'" in messages
    assert "$.due_date must match the pattern ^\\d{4}-\\d{2}-\\d{2}$; got 'tomorrow'" in messages
    assert "$.count must be >= 1; got 0" in messages
    assert "$ is missing required field 'title'" in messages
    assert any(m.startswith("$ has unexpected field(s) 'assignee'") for m in messages)
    assert {e.path for e in errors} >= {"$.priority", "$.due_date", "$.count", "$"}


def test_errors_are_bounded() -> None:
    schema = {"type": "object", "properties": {f"f{i}": {"type": "integer"} for i in range(30)}}
    errors = compiled(schema, "2020-12").errors({f"f{i}": "x" for i in range(30)}, limit=5)
    assert len(errors) == 6 and errors[-1].message == "and 25 more error(s)"


def test_oneof_errors_come_from_the_variant_that_was_meant() -> None:
    schema = {
        "oneOf": [
            {
                "type": "object",
                "properties": {"status": {"const": "success"}, "totalCount": {"type": "integer"}},
                "required": ["status", "totalCount"],
                "additionalProperties": False,
            },
            {
                "type": "object",
                "properties": {"status": {"const": "not_found"}, "reason": {"type": "string"}},
                "required": ["status", "reason"],
                "additionalProperties": False,
            },
        ]
    }
    errors = compiled(schema, "2020-12").errors({"status": "success", "totalCount": "1"})
    assert [e.message for e in errors] == [
        "$.totalCount must be an integer; got string '1' (closest allowed variant: status='success')"
    ]


# --- repairs -------------------------------------------------------------------------------------


def test_a_registered_repair_fixes_only_its_field_and_error() -> None:
    schema = {
        "type": "object",
        "properties": {
            "totalCount": {"type": "integer"},
            "page": {"type": "integer"},
            "results": {"type": "array", "items": {"type": "object", "properties": {"score": {"type": "number"}}}},
        },
    }
    v = compiled(schema, "2020-12")
    value = {"totalCount": "3", "page": "2", "results": [{"score": "0.5"}, {"score": 1}]}
    rules = [
        RepairRule(path="/totalCount", rule="numeric_string_to_integer"),
        RepairRule(path="/results/*/score", rule="numeric_string_to_number"),
    ]
    fixed, done = apply_repairs(value, v.raw_errors(value), rules)
    assert fixed == {"totalCount": 3, "page": "2", "results": [{"score": 0.5}, {"score": 1}]}
    assert len(done) == 2 and value["totalCount"] == "3"  # the original is untouched
    assert not v.is_valid(fixed)  # "page" has no rule: no repair, still invalid
    assert apply_repairs({"totalCount": "three"}, v.raw_errors({"totalCount": "three"}), rules)[1] == []


def test_lint_reports_soft_problems() -> None:
    c = contract({"type": "object", "properties": {"status": {"type": "string"}, "meta": {"type": "object"}}})
    codes = {(i.path, i.code) for i in lint_contract(c)}
    assert ("#/properties/status", "string-should-be-enum") in codes
    assert ("#/properties/meta", "open-object") in codes
    assert ("#", "no-required") in codes
    assert ("#/properties/status", "no-description") in codes
