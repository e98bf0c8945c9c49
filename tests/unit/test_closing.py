"""Closing objects by default restricts; it never turns an invalid instance valid (issue 9, item 6)."""

from __future__ import annotations

from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.contracts.closing import close_schema
from shared.contracts.registration import register_contract
from shared.contracts.validation import compiled
from shared.messages import ToolContract

D7 = "http://json-schema.org/draft-07/schema#"
DIALECTS = ["draft-07", "2019-09", "2020-12"]


def closed(schema: dict[str, Any], dialect: str = "2020-12") -> Any:
    return compiled(close_schema(schema, dialect), dialect)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_not_that_forbids_an_error_status_still_refuses_it_when_another_field_comes_along(dialect: str) -> None:
    schema = {
        "type": "object",
        "properties": {"status": {"type": "string"}, "detail": {"type": "string"}},
        "not": {"properties": {"status": {"const": "error"}}, "required": ["status"]},
    }
    v = closed(schema, dialect)
    assert not v.is_valid({"status": "error", "detail": "x"})
    assert not v.is_valid({"status": "error"})
    assert v.is_valid({"status": "ok", "detail": "x"})
    assert not v.is_valid({"status": "ok", "invented": 1})  # the object itself is still closed


@pytest.mark.parametrize("dialect", DIALECTS)
def test_an_if_then_requirement_is_not_bypassed_by_an_extra_field(dialect: str) -> None:
    schema = {
        "type": "object",
        "properties": {"kind": {"type": "string"}, "x": {"type": "integer"}, "note": {"type": "string"}},
        "if": {"properties": {"kind": {"const": "x"}}, "required": ["kind"]},
        "then": {"required": ["x"]},
    }
    v = closed(schema, dialect)
    assert not v.is_valid({"kind": "x", "note": "n"})  # `then` still applies: x is required
    assert v.is_valid({"kind": "x", "x": 1, "note": "n"})
    assert not v.is_valid({"kind": "x", "x": 1, "invented": 1})


def test_a_def_used_under_not_is_not_closed_where_it_is_defined() -> None:
    schema = {
        "type": "object",
        "$defs": {"failed": {"properties": {"status": {"const": "error"}}, "required": ["status"]}},
        "properties": {"status": {"type": "string"}, "detail": {"type": "string"}},
        "not": {"$ref": "#/$defs/failed"},
    }
    assert not closed(schema).is_valid({"status": "error", "detail": "x"})


def test_closing_a_oneof_branch_never_lets_an_instance_matching_two_branches_through() -> None:
    # Both branches accept {"a": 1, "b": 2}: oneOf refuses it. Closing each branch on its own would
    # make both fail... and adding a third field must not make exactly one of them pass.
    schema = {
        "type": "object",
        "oneOf": [
            {"properties": {"a": {"type": "integer"}}, "required": ["a"]},
            {"properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["b"]},
        ],
    }
    v = closed(schema)
    assert not v.is_valid({"a": 1, "b": 2})
    assert v.is_valid({"b": 2})
    assert not v.is_valid({"b": 2, "c": 3})  # closed through the holder instead


def test_contains_beside_max_contains_is_not_closed() -> None:
    schema = {"type": "array", "contains": {"type": "object", "properties": {"a": {"const": 1}}}, "maxContains": 1}
    assert not closed(schema).is_valid([{"a": 1}, {"a": 1, "b": 2}])


@pytest.mark.parametrize(
    ("applicator", "valid", "invalid"),
    [
        (
            {"anyOf": [{"properties": {"a": {"type": "string"}}, "required": ["a"]}, {"required": ["id"]}]},
            {"id": "1", "a": "x"},
            {"id": "1", "a": "x", "z": 1},
        ),
        (
            {"oneOf": [{"properties": {"a": {"type": "string"}}, "required": ["a"]}, {"required": ["b"]}]},
            {"id": "1", "a": "x"},
            {"id": "1", "a": "x", "z": 1},
        ),
        (
            {"if": {"properties": {"a": {"const": "x"}}}, "then": {"properties": {"b": {"type": "integer"}}}},
            {"id": "1", "a": "x", "b": 2},
            {"id": "1", "a": "y", "b": 2},
        ),
        (
            {"dependentSchemas": {"a": {"properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}}},
            {"id": "1", "a": "x", "b": 2},
            {"id": "1", "b": 2},
        ),
    ],
    ids=["anyOf", "oneOf", "if", "dependentSchemas"],
)
def test_an_explicit_unevaluated_properties_false_over_a_composition_is_respected(
    applicator: dict[str, Any], valid: dict[str, Any], invalid: dict[str, Any]
) -> None:
    schema = {"type": "object", "properties": {"id": {"type": "string"}}, "unevaluatedProperties": False, **applicator}
    registered = register_contract(ToolContract.model_validate(contract(schema)))
    assert registered.input_schema == schema  # nothing closed again underneath
    v = compiled(registered.input_schema, "2020-12")
    assert v.is_valid(valid)
    assert not v.is_valid(invalid)


def test_an_explicit_unevaluated_properties_false_beside_a_ref_is_respected() -> None:
    schema = {
        "type": "object",
        "$defs": {"base": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}},
        "$ref": "#/$defs/base",
        "properties": {"name": {"type": "string"}},
        "unevaluatedProperties": False,
    }
    registered = register_contract(ToolContract.model_validate(contract(schema)))
    assert registered.input_schema == schema
    v = compiled(registered.input_schema, "2020-12")
    assert v.is_valid({"id": "1", "name": "n"})
    assert not v.is_valid({"id": "1", "name": "n", "z": 1})


def test_a_discriminated_union_closes_each_variant_and_names_the_unexpected_field() -> None:
    schema = {
        "oneOf": [
            {
                "type": "object",
                "properties": {"status": {"const": "success"}, "total": {"type": "integer"}},
                "required": ["status", "total"],
            },
            {
                "type": "object",
                "properties": {"status": {"const": "not_found"}, "reason": {"type": "string"}},
                "required": ["status", "reason"],
            },
        ]
    }
    out = close_schema(schema, "2020-12")
    assert [b.get("additionalProperties") for b in out["oneOf"]] == [False, False]
    v = compiled(out, "2020-12")
    assert v.is_valid({"status": "not_found", "reason": "r"})
    errors = v.errors({"status": "success", "total": 1, "score": 0.5})
    assert [e.message for e in errors] == [
        "$ has unexpected field(s) 'score'; allowed fields: status, total (closest allowed variant: status='success')"
    ]


def test_variants_whose_discriminators_are_equal_numbers_are_not_closed_one_by_one() -> None:
    # 1 and 1.0 are the same JSON number: both variants can match, so closing one could make oneOf pass.
    schema = {
        "oneOf": [
            {"type": "object", "properties": {"k": {"const": 1}, "a": {}}, "required": ["k"]},
            {"type": "object", "properties": {"k": {"const": 1.0}, "b": {}}, "required": ["k"]},
        ]
    }
    v = closed(schema)
    assert not v.is_valid({"k": 1, "a": 1})  # both variants match: oneOf refuses, closed or not
    assert not v.is_valid({"k": 1, "z": 1})


def test_an_object_beside_a_dynamic_ref_is_left_as_declared() -> None:
    schema = {"$dynamicAnchor": "node", "type": "object", "properties": {"a": {}}, "$dynamicRef": "#node"}
    assert close_schema(schema, "2020-12") == schema  # what the dynamic target declares is not known here


def test_a_composition_closed_through_unevaluated_properties_names_the_field_and_what_is_allowed() -> None:
    schema = {
        "type": "object",
        "properties": {"id": {"type": "string"}},
        "allOf": [{"properties": {"name": {"type": "string"}}}],
    }
    errors = closed(schema).errors({"id": "1", "name": "n", "invented": True})
    assert [e.message for e in errors] == ["$ has unexpected field(s) 'invented'; allowed fields: id, name"]


def test_a_draft07_composition_is_closed_over_every_field_name_it_declares() -> None:
    schema = {
        "$schema": D7,
        "type": "object",
        "properties": {"id": {"type": "string"}},
        "anyOf": [{"properties": {"a": {"type": "string"}}, "required": ["a"]}, {"required": ["b"]}],
        "allOf": [{"properties": {"b": {"type": "integer"}}}],
    }
    v = closed(schema, "draft-07")
    assert v.is_valid({"id": "1", "a": "x"}) and v.is_valid({"id": "1", "b": 2})
    assert not v.is_valid({"id": "1", "a": "x", "z": 1})


def test_a_subschema_object_used_in_two_places_is_closed_at_each_on_its_own() -> None:
    failed = {"type": "object", "properties": {"status": {"const": "error"}}, "required": ["status"]}
    schema = {"type": "object", "properties": {"last": failed, "current": {"not": failed}}}  # one dict, twice
    v = closed(schema)
    assert not v.is_valid({"current": {"status": "error", "detail": "x"}})
    assert not v.is_valid({"last": {"status": "error", "detail": "x"}})


def contract(schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": "t", "description": "a tool used in tests only", "inputSchema": schema, "outputSchema": schema}


# --- the property: closed-valid implies valid ------------------------------------------------------

# A small world, so that random schemas and random instances meet: two declared names, one
# that schemas never declare ("detail"), few values.
NAMES = ["a", "status"]
_leaf_values = st.sampled_from(["error", 1, None])


def _leaves(with_ref: bool) -> st.SearchStrategy[Any]:
    simple = st.sampled_from([{}, {}, {"type": "string"}, {"type": "object"}, {"required": ["status"]}])
    consts = st.builds(lambda v: {"const": v}, _leaf_values)
    return st.one_of(consts, simple, *([st.just({"$ref": "#/$defs/d"})] if with_ref else []))


@cache
def _bodies(dialect: str, depth: int, with_ref: bool) -> st.SearchStrategy[Any]:
    """Schemas nested ``depth`` levels: objects, every composition keyword, arrays, refs to one def."""
    if depth == 0:
        return _leaves(with_ref)
    sub = _bodies(dialect, depth - 1, with_ref)
    pair = st.lists(sub, min_size=2, max_size=2)
    obj = st.builds(
        lambda props, req, typed: {
            **({"type": "object"} if typed else {}),
            "properties": props,
            **({"required": sorted(req)} if req else {}),
        },
        st.dictionaries(st.sampled_from(NAMES), sub, min_size=1, max_size=2),
        st.sets(st.sampled_from(NAMES), max_size=1),
        st.booleans(),
    )
    options = [
        obj,
        obj,
        st.builds(lambda s: {"not": s}, sub),
        st.builds(lambda i, t, e: {"if": i, "then": t, "else": e}, sub, sub, sub),
        st.builds(lambda i, t: {"if": i, "then": t}, sub, sub),
        st.builds(lambda b: {"oneOf": b}, pair),
        st.builds(lambda b: {"anyOf": b}, pair),
        st.builds(lambda b: {"allOf": b}, pair),
        st.builds(lambda o, b: {**o, "oneOf": b}, obj, pair),
        st.builds(lambda o, n: {**o, "not": n}, obj, sub),
        st.builds(lambda o, i: {**o, "if": i, "then": {"required": ["a"]}}, obj, sub),
        st.builds(lambda s: {"type": "array", "items": s}, sub),
        _leaves(with_ref),
    ]
    if dialect == "draft-07":
        options.append(st.builds(lambda o, s: {**o, "dependencies": {"a": s}}, obj, sub))
    else:
        options.append(st.builds(lambda o, s: {**o, "dependentSchemas": {"a": s}}, obj, sub))
        options.append(st.builds(lambda s: {"type": "array", "contains": s, "maxContains": 1}, sub))
    return st.one_of(*options)


def _schemas(dialect: str) -> st.SearchStrategy[Any]:
    # the root may use a def (reached through $ref, e.g. under `not`); the def does not refer to itself
    random = st.builds(
        lambda root, d: {**root, "$defs": {"d": d}},
        _bodies(dialect, 3, with_ref=True),
        _bodies(dialect, 2, with_ref=False),
    )
    return st.one_of(random, _compositions(dialect))


# Nested objects that closing would close, placed in every position a composition offers.
_payloads = st.recursive(
    st.builds(
        lambda name, v: {"properties": {name: {"properties": {"status": {"const": v}}, "required": ["status"]}}},
        st.sampled_from(NAMES),
        _leaf_values,
    ),
    lambda sub: st.builds(
        lambda name, s, req: {"properties": {name: s}, **({"required": [name]} if req else {})},
        st.sampled_from(NAMES),
        sub,
        st.booleans(),
    ),
    max_leaves=3,
)
_WRAPS = ["not", "if-then", "if-then-else", "oneOf", "anyOf", "allOf", "property", "ref", "items", "dependent"]


def _wrap(kind: str, s: Any, other: Any, defs: dict[str, Any], dialect: str) -> Any:
    if kind == "not":
        return {"not": s}
    if kind == "if-then":
        return {"if": s, "then": {"required": ["a"]}}
    if kind == "if-then-else":
        return {"if": s, "then": other, "else": {"required": ["a"]}}
    if kind in ("oneOf", "anyOf", "allOf"):
        return {kind: [s, other]}
    if kind == "property":
        return {"properties": {"a": s}}
    if kind == "ref":
        name = f"d{len(defs)}"
        defs[name] = s
        return {"$ref": f"#/$defs/{name}"}
    if kind == "items":
        return {"type": "array", "contains": s, "maxContains": 1} if dialect != "draft-07" else {"items": s}
    key = "dependencies" if dialect == "draft-07" else "dependentSchemas"
    return {"properties": {"status": {}}, key: {"status": s}}


@st.composite
def _compositions(draw: st.DrawFn, dialect: str) -> dict[str, Any]:
    defs: dict[str, Any] = {}
    schema = draw(_payloads)
    for kind in draw(st.lists(st.sampled_from(_WRAPS), min_size=1, max_size=2)):
        schema = _wrap(kind, schema, draw(_payloads), defs, dialect)
    holder = {"properties": {"a": {}, "status": {}}}
    alone = schema if isinstance(schema, dict) else {"allOf": [schema]}
    beside = {**alone, **holder} if "properties" not in alone else {**holder, "allOf": [schema]}
    root: dict[str, Any] = draw(st.sampled_from([alone, {**holder, "allOf": [schema]}, beside]))
    return {**root, "$defs": {**defs, "d": {}}}


_instances = st.recursive(
    _leaf_values,
    lambda sub: st.lists(sub, max_size=2) | st.dictionaries(st.sampled_from([*NAMES, "detail"]), sub, max_size=3),
    max_leaves=8,
)


_SCHEMAS = {d: _schemas(d) for d in DIALECTS}


def _probes(schema: Any, root: dict[str, Any], depth: int = 0) -> list[Any]:
    """Instances built from the schema itself: what each part declares, and that with an undeclared field."""
    if not isinstance(schema, dict) or depth > 5:
        return [1, "error", None, {}]
    if "const" in schema:
        return [schema["const"]]
    if "$ref" in schema:
        return _probes(root["$defs"]["d"], root, depth + 1)
    own: list[Any] = []
    if schema.get("properties"):
        filled: list[dict[str, Any]] = [{}]
        for name, sub in schema["properties"].items():
            filled = [{**f, name: v} for f in filled for v in _probes(sub, root, depth + 1)[:3]][:4]
        own = [x for f in filled for x in (f, {**f, "detail": 1})]
    if "items" in schema or "contains" in schema:
        inner = _probes(schema.get("items", schema.get("contains")), root, depth + 1)
        own += [inner[:2], inner[:1] * 2]
    parts: list[Any] = []
    for key in ("allOf", "anyOf", "oneOf"):
        for sub in schema.get(key, []):
            parts += _probes(sub, root, depth + 1)
    for key in ("not", "if", "then", "else"):
        parts += _probes(schema[key], root, depth + 1) if key in schema else []
    for sub in (schema.get("dependentSchemas") or schema.get("dependencies") or {}).values():
        parts += _probes(sub, root, depth + 1)
    merged = [{**o, **p} for o in own[:2] for p in parts if isinstance(o, dict) and isinstance(p, dict)]
    return (own + parts + merged)[:16] or [1, "error", None, {}]


@pytest.mark.slow
@pytest.mark.parametrize("dialect", DIALECTS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), instances=st.lists(_instances, min_size=1, max_size=8))
def test_closing_never_turns_an_invalid_instance_valid(dialect: str, data: st.DataObject, instances: list[Any]) -> None:
    schema = data.draw(_SCHEMAS[dialect], label="schema")
    schema = {"$schema": D7, **schema} if dialect == "draft-07" else schema
    original = compiled(schema, dialect)
    closed_v = compiled(close_schema(schema, dialect), dialect)
    for instance in [*instances, *_probes(schema, schema)]:
        if closed_v.is_valid(instance):
            assert original.is_valid(instance), "closing let an invalid instance through"
        assert closed_v.is_valid(instance) == (not closed_v.raw_errors(instance))  # both engines agree
