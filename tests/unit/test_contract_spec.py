"""Contracts follow the JSON Schema specification where registration used to refuse valid schemas or
accept invalid values (issue 9, item 7). Each behaviour is checked in both engines: jsonschema-rs
(``is_valid``) and python-jsonschema (``raw_errors``)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
import regress
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.contracts.dialect import ContractError
from shared.contracts.ecma import pattern_problem
from shared.contracts.output import check_output
from shared.contracts.registration import register_contract, validator_for
from shared.contracts.validation import CompiledSchema, compiled
from shared.messages import ToolContract

D7 = "http://json-schema.org/draft-07/schema#"
D19 = "https://json-schema.org/draft/2019-09/schema"
D20 = "https://json-schema.org/draft/2020-12/schema"


def contract(inp: dict[str, Any], out: dict[str, Any] | None = None) -> ToolContract:
    return ToolContract.model_validate(
        {
            "name": "t",
            "description": "a tool used in tests only",
            "inputSchema": inp,
            "outputSchema": out or {"type": "object"},
        }
    )


def registered_input(schema: dict[str, Any]) -> CompiledSchema:
    return validator_for(register_contract(contract(schema)), "input")


def verdict(v: CompiledSchema, instance: Any) -> bool:
    """The one answer both engines give (the test fails if they differ)."""
    fast, explained = v.is_valid(instance), not v.raw_errors(instance)
    assert fast == explained, f"engines disagree on {instance!r}: fast={fast}, explaining={explained}"
    return fast


def refusal(schema: dict[str, Any]) -> ContractError:
    with pytest.raises(ContractError) as err:
        register_contract(contract(schema))
    return err.value


# --- $ref ---------------------------------------------------------------------------------------


def test_a_percent_encoded_ref_fragment_is_decoded_and_reaches_its_key() -> None:
    v = registered_input(
        {
            "type": "object",
            "$defs": {"[-_.a-zA-Z0-9]+": {"type": "string"}, "50%": {"type": "integer"}},
            "properties": {"x": {"$ref": "#/$defs/%5B-_.a-zA-Z0-9%5D%2B"}, "y": {"$ref": "#/$defs/50%25"}},
        }
    )
    assert verdict(v, {"x": "s", "y": 1})
    assert not verdict(v, {"x": 1}) and not verdict(v, {"y": "s"})


def test_a_ref_fragment_with_unencoded_brackets_is_refused_with_the_fix() -> None:
    err = refusal(
        {
            "type": "object",
            "$defs": {"[a]": {"type": "string"}},
            "properties": {"x": {"$ref": "#/$defs/[a]"}},
        }
    )
    assert err.problem.path == "#/properties/x/$ref" and "percent-encode" in err.problem.message


def test_tilde_and_slash_escaped_keys_can_be_referenced() -> None:
    v = registered_input(
        {
            "type": "object",
            "$defs": {"a/b": {"type": "integer"}, "c~d": {"type": "string"}},
            "properties": {"x": {"$ref": "#/$defs/a~1b"}, "y": {"$ref": "#/$defs/c~0d"}},
        }
    )
    assert verdict(v, {"x": 1, "y": "s"})
    assert not verdict(v, {"x": "s"}) and not verdict(v, {"y": 1})


@pytest.mark.parametrize("dialect", [D7, D20])
def test_a_ref_back_to_the_schemas_own_id_is_local(dialect: str) -> None:
    container = "definitions" if dialect == D7 else "$defs"
    v = registered_input(
        {
            "$schema": dialect,
            "$id": "https://backstage.example/schema/catalog-info.json",
            "type": "object",
            container: {"name": {"type": "string", "minLength": 2}},
            "properties": {"name": {"$ref": f"catalog-info.json#/{container}/name"}},
        }
    )
    assert verdict(v, {"name": "ab"}) and not verdict(v, {"name": "a"})


def test_a_relative_ref_resolves_against_the_nested_id() -> None:
    v = registered_input(
        {
            "$id": "https://example.com/schemas/root.json",
            "type": "object",
            "$defs": {
                "address": {
                    "$id": "https://example.com/schemas/address/address.json",
                    "$defs": {"city": {"$id": "city.json", "type": "string"}},
                    "type": "object",
                    "properties": {"city": {"$ref": "city.json#"}},
                }
            },
            "properties": {"home": {"$ref": "address/address.json"}},
        }
    )
    assert verdict(v, {"home": {"city": "Seoul"}})
    assert not verdict(v, {"home": {"city": 3}})


def test_a_ref_to_another_document_is_still_remote() -> None:
    err = refusal({"$id": "https://example.com/a.json", "type": "object", "properties": {"x": {"$ref": "b.json"}}})
    assert "remote $ref 'b.json'" in err.problem.message


@pytest.mark.parametrize("container", ["definitions", "$defs"])
@pytest.mark.parametrize("dialect", [D7, D20])
def test_a_root_ref_beside_a_definitions_container_is_accepted(dialect: str, container: str) -> None:
    out = {
        "$schema": dialect,
        "$ref": f"#/{container}/result",
        container: {"result": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}},
    }
    registered = register_contract(contract({"type": "object"}, out))
    v = validator_for(registered, "output")
    assert verdict(v, {"ok": True})
    assert not verdict(v, {"ok": "yes"}) and not verdict(v, {"ok": True, "invented": 1})


# --- patterns are ECMA-262 ------------------------------------------------------------------------


def test_a_unicode_property_escape_registers_and_matches_the_same_in_both_engines() -> None:
    v = registered_input({"type": "object", "properties": {"name": {"type": "string", "pattern": r"^\p{Letter}+$"}}})
    assert verdict(v, {"name": "Émile"}) and verdict(v, {"name": "서울"})
    assert not verdict(v, {"name": "R2D2"})


def test_an_ecma_named_group_registers_and_validates_the_same_in_both_engines() -> None:
    v = registered_input(
        {"type": "object", "properties": {"day": {"type": "string", "pattern": r"^(?<year>\d{4})-(?<month>\d{2})$"}}}
    )
    assert verdict(v, {"day": "2024-05"})
    assert not verdict(v, {"day": "24-05"})


def test_a_python_only_named_group_is_refused_as_not_ecma_262() -> None:
    err = refusal({"type": "object", "properties": {"d": {"type": "string", "pattern": r"^(?P<year>\d{4})$"}}})
    assert err.problem.path == "#/properties/d/pattern" and "ECMA-262" in err.problem.message


def test_ecma_digit_and_word_classes_are_ascii_in_both_engines() -> None:
    v = registered_input({"type": "object", "properties": {"n": {"type": "string", "pattern": r"^\d+$"}}})
    assert verdict(v, {"n": "123"})
    assert not verdict(v, {"n": "১২৩"})  # Bengali digits: \d is [0-9] in ECMA-262


def test_pattern_properties_use_ecma_262_in_both_engines() -> None:
    v = registered_input({"type": "object", "patternProperties": {r"^\p{Lu}": {"type": "integer"}}})
    assert verdict(v, {"Ärger": 1})
    assert not verdict(v, {"Ärger": "x"})
    assert not verdict(v, {"ärger": 1})  # closed: a field no pattern covers


def test_a_word_boundary_is_ascii_as_in_ecma_262_in_both_engines() -> None:
    v = registered_input({"type": "object", "properties": {"w": {"type": "string", "pattern": r"\bcat\b"}}})
    assert verdict(v, {"w": "a cat."})
    assert not verdict(v, {"w": "concat"})
    assert verdict(v, {"w": "écat"})  # é is not a word character in ECMA-262 (Unicode-aware engines disagree)


def test_a_pattern_with_a_negated_shorthand_in_a_class_matches_any_character() -> None:
    v = registered_input({"type": "object", "properties": {"t": {"type": "string", "pattern": r"^[\s\S]{2}$"}}})
    assert verdict(v, {"t": "a\n"}) and not verdict(v, {"t": "abc"})


def test_a_pattern_that_backtracks_exponentially_elsewhere_is_matched_in_linear_time() -> None:
    v = registered_input({"type": "object", "properties": {"s": {"type": "string", "pattern": r"^(a+)+$"}}})

    def cost(n: int) -> float:
        hostile = {"s": "a" * n + "!"}
        start = time.perf_counter()
        for _ in range(50):
            assert not verdict(v, hostile)
        return time.perf_counter() - start

    cost(4)  # warm the caches
    # A backtracking matcher doubles its work per character (2^20 times more at 24 than at 4).
    assert cost(24) < 50 * cost(4)


# Patterns in the shapes tools use, checked against regress (an ECMA-262 engine) as the reference.
# Groups are never quantified here: regress backtracks, and these run on generated strings.
_REFERENCE_PATTERNS = [
    r"^\d+$",
    r"^\w+$",
    r"^\s*\S+$",
    r"^.$",
    r"^..?$",
    r"\bab",
    r"a\B",
    r"^[\s\S]$",
    r"^[\w.-]+$",
    r"^[^\s@]+@[^\s@]+$",
    r"^\p{Letter}+$",
    r"^\p{Lu}\p{Ll}*$",
    r"^\P{L}$",
    r"^(?<y>\d{2})-(?<m>\d)$",
    r"^(?!.*\.\.)[a-z.]+$",
    r"(?<=\d)x",
    r"(?<!\w)a",
    r"^(?=\w)\W?.$",
    r"^\u00e9|\x41$",
    r"^[\d\s]+$",
    r"^\D\W$",
    r"^\-?\d$",
    r"^[a\S]$",
    r"^(?=\d).$",
    r"^(?=\w).$",
    r"^(?=\s).$",
    r"^(?=.)\W$",
    r"^(?!\S).$",
    r"^(?=\b).",
]
_ALPHABET = [*"aAbxé1٣.-_ @", "\n", "\r", "\t", "\u2028", "\u00a0", "\ufeff", "\u0085", "\u212a", "😀", "ſ"]


@settings(max_examples=400, deadline=None)
@given(pattern=st.sampled_from(_REFERENCE_PATTERNS), text=st.text(alphabet=st.sampled_from(_ALPHABET), max_size=6))
def test_both_engines_match_patterns_as_ecma_262_does(pattern: str, text: str) -> None:
    assert pattern_problem(pattern) is None
    try:
        engine = regress.Regex(pattern, "u")
    except regress.RegressError:  # an Annex B pattern (e.g. "\-" outside a class): no u flag
        engine = regress.Regex(pattern)
    reference = engine.find(text) is not None
    v = compiled({"type": "string", "pattern": pattern}, "2020-12")
    assert verdict(v, text) == reference, f"{pattern!r} on {text!r}: ECMA-262 says {reference}"


def test_the_regex_format_means_ecma_262_in_both_engines() -> None:
    v = compiled({"type": "string", "format": "regex"}, "2020-12")
    assert verdict(v, r"^\p{Letter}(?<rest>.*)$")
    assert not verdict(v, r"(?P<name>x)")


# --- annotations -------------------------------------------------------------------------------------


def test_draft07_deprecated_is_accepted_as_an_annotation() -> None:
    v = registered_input(
        {"$schema": D7, "type": "object", "properties": {"old": {"type": "string", "deprecated": True}}}
    )
    assert verdict(v, {"old": "x"}) and not verdict(v, {"old": 1})


# --- formats ------------------------------------------------------------------------------------------

_UUID = str(uuid.UUID(int=0x123E4567E89B12D3A456426614174000))


@pytest.mark.parametrize(
    ("fmt", "good", "bad"),
    [
        ("uuid", _UUID, _UUID + "\n"),
        ("time", "12:34:56Z", "12:3\u09ea:56Z"),  # a Bengali digit four
        ("time", "12:34:56Z", "12:34:56Z\n"),
        ("date", "2024-02-29", "2024-02-2\u0669"),  # an Arabic-Indic digit nine
        ("date-time", "2024-02-29T10:00:00Z", "2024-02-29T10:00:00Z\n"),
        ("email", "a@b.example", "a@b.example\n"),
        ("hostname", "example.com", "example.com\n"),
        ("ipv4", "10.0.0.1", "10.0.0.\u0661"),
        ("duration", "P3D", "P3D\n"),
    ],
)
def test_formats_refuse_a_trailing_newline_and_non_ascii_digits_in_both_engines(fmt: str, good: str, bad: str) -> None:
    v = compiled({"type": "string", "format": fmt}, "2020-12")
    assert verdict(v, good)
    assert not verdict(v, bad)


# --- errors never crash -------------------------------------------------------------------------------


def checked_output(output_schema: dict[str, Any], output: Any) -> Any:
    """``output`` as the validator checks it against a registered tool with ``output_schema``."""
    registered = register_contract(contract({"type": "object"}, output_schema))
    return check_output(registered, output)


def test_check_output_reports_a_false_subschema_instead_of_crashing() -> None:
    schema = {"type": "object", "properties": {"a": {"allOf": [False, {"type": "string"}]}}}
    checked = checked_output(schema, {"a": 1})
    assert checked.result == "invalid"
    messages = [e.message for e in checked.errors]
    assert "$.a is not allowed here; got 1" in messages
    assert "$.a must be a string; got integer 1" in messages


def test_an_output_error_is_reported_once_however_many_ways_it_is_reached() -> None:
    schema = {
        "oneOf": [
            {
                "type": "object",
                "properties": {"status": {"const": "ok"}, "n": {"type": "number"}},
                "required": ["status", "n"],
            },
            {
                "type": "object",
                "properties": {"status": {"const": "error"}, "why": {"type": "string"}},
                "required": ["status", "why"],
            },
        ]
    }
    messages = [e.message for e in checked_output(schema, {"x": 1}).errors]
    assert messages and len(messages) == len(set(messages)), messages
    assert any("missing required field 'status'" in m for m in messages)
