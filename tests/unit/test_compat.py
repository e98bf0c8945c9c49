"""The compatibility rules one by one: each breaking kind, each allowed kind (``loopwarden/generate/compat.py``)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from loopwarden.generate.compat import (
    Contracts,
    Finding,
    compare,
    compare_asyncapi,
    compare_catalogue,
    compare_schemas,
    pattern_relation,
)

ID = {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"}
BASE: dict[str, Any] = {
    "type": "object",
    "properties": {
        "run_id": ID,
        "status": {"enum": ["running", "completed"], "type": "string"},
        "count": {"type": "integer", "minimum": 0, "maximum": 10},
        "note": {"anyOf": [{"type": "string", "maxLength": 100}, {"type": "null"}], "default": None},
        "tags": {"type": "array", "items": {"type": "string"}},
        "detail": {"$ref": "#/$defs/Detail"},
    },
    "required": ["run_id", "status", "detail"],
    "$defs": {"Detail": {"type": "object", "properties": {"why": {"type": "string"}}, "required": ["why"]}},
}


def changed(edit: Any) -> dict[str, Any]:
    new = copy.deepcopy(BASE)
    edit(new)
    return new


def props(s: dict[str, Any]) -> dict[str, Any]:
    p: dict[str, Any] = s["properties"]
    return p


def add_required_tenant(s: dict[str, Any]) -> None:
    props(s)["tenant"] = ID
    s["required"].append("tenant")


BREAKING_CASES = [
    ("a removed field", lambda s: props(s).pop("count"), "count", "removed_field", "older reader reads it"),
    ("a removed required field", lambda s: props(s).pop("status"), "status", "removed_field", "requires it"),
    (
        "a renamed field",
        lambda s: props(s).__setitem__("runId", props(s).pop("run_id")),
        "run_id",
        "removed_field",
        "rename",
    ),
    (
        "a new required field",
        add_required_tenant,
        "tenant",
        "new_required_field",
        "older writer does not send it",
    ),
    (
        "an optional field made required",
        lambda s: s["required"].append("count"),
        "count",
        "now_required",
        "leave it out",
    ),
    (
        "a required field made optional",
        lambda s: s["required"].remove("status"),
        "status",
        "now_optional",
        "requires it",
    ),
    (
        "an enum value removed",
        lambda s: props(s)["status"].__setitem__("enum", ["running"]),
        "status",
        "narrowed",
        'values removed ["completed"]',
    ),
    (
        "a tighter pattern",
        lambda s: props(s)["run_id"].__setitem__("pattern", "^[A-Za-z0-9_-]{1,32}$"),
        "run_id",
        "narrowed",
        "pattern tighter",
    ),
    (
        "a changed pattern nobody can prove looser",
        lambda s: props(s)["run_id"].__setitem__("pattern", "^[a-z]{1,64}$"),
        "run_id",
        "narrowed",
        "not provably looser",
    ),
    (
        "a lower maxLength",
        lambda s: props(s)["note"]["anyOf"][0].__setitem__("maxLength", 50),
        "note",
        "narrowed",
        "maxLength 100 -> 50",
    ),
    ("a lower maximum", lambda s: props(s)["count"].__setitem__("maximum", 5), "count", "narrowed", "maximum 10 -> 5"),
    ("a higher minimum", lambda s: props(s)["count"].__setitem__("minimum", 1), "count", "narrowed", "minimum 0 -> 1"),
    (
        "a type change",
        lambda s: props(s)["count"].__setitem__("type", "string"),
        "count",
        "type_changed",
        "integer -> string",
    ),
    (
        "a union member removed (optional -> not nullable)",
        lambda s: props(s).__setitem__("note", {"type": "string", "maxLength": 100}),
        "note",
        "narrowed",
        "no longer accepts null",
    ),
    (
        "a field inside a definition removed",
        lambda s: s["$defs"]["Detail"]["properties"].pop("why"),
        "detail.why",
        "removed_field",
        "requires it",
    ),
    (
        "a list's item type changed",
        lambda s: props(s)["tags"]["items"].__setitem__("type", "integer"),
        "tags[]",
        "type_changed",
        "string -> integer",
    ),
    (
        "an object closed to fields it does not name",
        lambda s: s["$defs"]["Detail"].__setitem__("additionalProperties", False),
        "detail",
        "narrowed",
        "refuses fields it does not name",
    ),
    (
        "a new format",
        lambda s: props(s)["run_id"].__setitem__("format", "uuid"),
        "run_id",
        "narrowed",
        "format none -> uuid",
    ),
]


@pytest.mark.parametrize(("what", "edit", "field", "kind", "says"), BREAKING_CASES, ids=[c[0] for c in BREAKING_CASES])
def test_a_change_an_older_reader_or_writer_cannot_handle_is_breaking_and_says_where_and_why(
    what: str, edit: Any, field: str, kind: str, says: str
) -> None:
    findings = compare_schemas("Thing", BASE, changed(edit))
    bad = [f for f in findings if f.breaking]
    if kind is None:  # the no-op rows: nothing to break
        assert bad == [], what
        return
    assert [(f.field, f.kind) for f in bad] == [(field, kind)], [str(f) for f in findings]
    assert says in bad[0].why, str(bad[0])
    assert str(bad[0]).startswith(f"Thing.{field}: {kind.replace('_', ' ')}: ")


def test_a_number_made_an_integer_is_narrowed() -> None:
    [f] = compare_schemas("Price", {"type": "number"}, {"type": "integer"})
    assert (f.kind, f.breaking) == ("narrowed", True) and "number is refused" in f.why


def test_a_field_added_to_an_object_older_readers_close_is_refused_by_them() -> None:
    old = copy.deepcopy(BASE)
    old["$defs"]["Detail"]["additionalProperties"] = False
    new = copy.deepcopy(old)
    new["$defs"]["Detail"]["properties"]["code"] = {"type": "integer"}
    [f] = compare_schemas("Thing", old, new)
    assert (f.field, f.kind, f.breaking) == ("detail.code", "field_refused", True)
    assert "additionalProperties: false" in f.why


ALLOWED_CASES = [
    ("a new optional field", lambda s: props(s).__setitem__("tenant", ID), "tenant", "new_optional_field"),
    ("a new enum value", lambda s: props(s)["status"]["enum"].append("failed"), "status", "widened"),
    (
        "a looser pattern",
        lambda s: props(s)["run_id"].__setitem__("pattern", "^[A-Za-z0-9_-]{1,128}$"),
        "run_id",
        "widened",
    ),
    ("a higher maximum", lambda s: props(s)["count"].__setitem__("maximum", 100), "count", "widened"),
    ("integer to number", lambda s: props(s)["count"].__setitem__("type", "number"), "count", "widened"),
    (
        "a field made nullable",
        lambda s: props(s).__setitem__("run_id", {"anyOf": [ID, {"type": "null"}]}),
        "run_id",
        "widened",
    ),
    ("a dropped maxLength", lambda s: props(s)["note"]["anyOf"][0].pop("maxLength"), "note", "widened"),
    (
        "a required field's default (descriptions, titles)",
        lambda s: props(s)["count"].__setitem__("title", "N"),
        "",
        "",
    ),
]


@pytest.mark.parametrize(("what", "edit", "field", "kind"), ALLOWED_CASES, ids=[c[0] for c in ALLOWED_CASES])
def test_an_additive_or_widening_change_is_allowed(what: str, edit: Any, field: str, kind: str) -> None:
    findings = compare_schemas("Thing", BASE, changed(edit))
    assert [f for f in findings if f.breaking] == [], [str(f) for f in findings]
    assert [(f.field, f.kind) for f in findings] == ([(field, kind)] if kind else [])


def test_widening_tells_to_upgrade_readers_first() -> None:
    [f] = compare_schemas("Thing", BASE, changed(lambda s: props(s)["status"]["enum"].append("failed")))
    assert "upgrade its readers" in f.why and "new writer -> old reader" in f.why


@pytest.mark.parametrize(
    ("old", "new", "relation"),
    [
        ("^[a-z]{1,64}$", "^[a-z]{1,64}$", "same"),
        ("^[a-z]{1,64}$", "^[a-z]{1,128}$", "wider"),
        ("^[a-z]{1,64}$", "^[a-z]{0,64}$", "wider"),
        ("^[a-z]{1,64}$", "^[a-z]{1,}$", "wider"),
        ("^[a-z]{1,64}$", "^[a-z]{2,64}$", "narrower"),
        ("^[a-z]{1,64}$", "^[a-z]{2,128}$", "unknown"),
        ("^[a-z]{1,64}$", "^[a-zA-Z]{1,64}$", "unknown"),
    ],
)
def test_patterns_that_differ_only_in_their_bounds_compare_by_them(old: str, new: str, relation: str) -> None:
    assert pattern_relation(old, new) == relation


def test_a_recursive_definition_is_compared_without_looping() -> None:
    tree: dict[str, Any] = {
        "$ref": "#/$defs/Node",
        "$defs": {
            "Node": {
                "type": "object",
                "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}, "n": {"type": "integer"}},
            }
        },
    }
    new = copy.deepcopy(tree)
    new["$defs"]["Node"]["properties"].pop("n")
    assert {(f.field, f.kind) for f in compare_schemas("Tree", tree, new)} == {("n", "removed_field")}


# --- subjects ----------------------------------------------------------------------------------------------------


FLAT = {"type": "object", "properties": {"run_id": ID}, "required": ["run_id"]}


def doc(*channels: tuple[str, str, str]) -> dict[str, Any]:
    """An AsyncAPI 3 document with (address, action, contract) channels."""
    out: dict[str, Any] = {
        "channels": {},
        "operations": {},
        "components": {"messages": {}, "schemas": {c: FLAT for _, _, c in channels}},
    }
    for i, (address, action, contract) in enumerate(channels):
        out["components"]["messages"][f"m{i}"] = {"payload": {"$ref": f"#/components/schemas/{contract}"}}
        out["channels"][f"c{i}"] = {"address": address, "messages": {"M": {"$ref": f"#/components/messages/m{i}"}}}
        out["operations"][f"o{i}"] = {"action": action, "channel": {"$ref": f"#/channels/c{i}"}}
    return out


V1 = ("lw.v1.cmd.thing", "receive", "Thing")
V2 = ("lw.v2.cmd.thing", "receive", "Thing")


def kinds(findings: list[Finding]) -> list[tuple[str, str, bool]]:
    return [(f.contract, f.kind, f.breaking) for f in findings]


def test_a_removed_subject_is_breaking() -> None:
    found = compare_asyncapi(doc(V1, ("lw.v1.evt.x", "send", "Thing")), doc(V1))
    assert kinds(found) == [("channel lw.v1.evt.x (send)", "removed_subject", True)]
    assert "still publishes on it" in found[0].why


def test_a_new_subject_is_allowed() -> None:
    assert kinds(compare_asyncapi(doc(V1), doc(V1, V2))) == [
        ("channel lw.v2.cmd.thing (receive)", "new_subject", False)
    ]


def test_a_subject_is_retired_only_after_a_release_served_its_successor() -> None:
    assert kinds(compare_asyncapi(doc(V1, V2), doc(V2))) == [
        ("channel lw.v1.cmd.thing (receive)", "retired_subject", False)
    ]
    assert kinds(compare_asyncapi(doc(V1), doc(V2)))[0] == (
        "channel lw.v1.cmd.thing (receive)",
        "removed_subject",
        True,
    )


def test_a_subject_that_carries_another_contract_is_breaking() -> None:
    other = doc(("lw.v1.cmd.thing", "receive", "Other"))
    other["components"]["schemas"]["Other"] = {"type": "object", "properties": {"n": {"type": "integer"}}}
    found = compare_asyncapi(doc(V1), other)
    assert ("channel lw.v1.cmd.thing (receive)", "payload_changed", True) in kinds(found)


def test_a_removed_catalogue_subject_is_breaking_and_a_new_one_is_not() -> None:
    old = {"subjects": {"lw.v1.cmd.a": "A", "lw.v1.cmd.b": "B"}}
    new = {"subjects": {"lw.v1.cmd.a": "A", "lw.v1.cmd.c": "C"}}
    assert sorted(kinds(compare_catalogue(old, new))) == [
        ("catalogue", "new_subject", False),
        ("catalogue", "removed_subject", True),
    ]


def test_a_breaking_change_is_allowed_as_a_new_subject_version_with_both_versions_served() -> None:
    old = Contracts({"Thing": BASE}, {}, doc(V1))
    v2 = changed(add_required_tenant)
    served_both = Contracts({"Thing": v2, "ThingV1": BASE}, {}, doc(("lw.v1.cmd.thing", "receive", "ThingV1"), V2))
    found = compare(old, served_both)
    assert [f for f in found if f.breaking] == [], [str(f) for f in found]
    assert ("Thing", "versioned", False) in kinds(found)
    # the same change on the same subject, or with the old version no longer served, is refused
    in_place = Contracts({"Thing": v2}, {}, doc(V1))
    assert ("Thing", "new_required_field", True) in kinds(compare(old, in_place))
    v1_dropped = Contracts({"Thing": v2}, {}, doc(V2))
    assert ("Thing", "new_required_field", True) in kinds(compare(old, v1_dropped))
