"""Closed objects by default, without ever letting an invalid instance through.

An object schema that lists ``properties`` and says nothing about extra fields is treated
as closed: a field the tool (or the model) invents is caught here instead of flowing on to
break something far away. Opt-outs, for wrapped third-party APIs:

* ``"additionalProperties"`` or ``"unevaluatedProperties"`` (any explicit value) on one object;
* ``"x-loopwarden-open": true`` on a schema opens it and its whole subtree.

Closing only ever adds a restriction where a restriction cannot turn into a permission:

* Nothing is closed inside ``not``, ``if``, ``oneOf`` branches or ``contains`` beside
  ``maxContains`` (nor in what a ``$ref`` reaches from there): a stricter subschema in those
  positions makes the whole schema *accept* more (a ``not`` forbidding ``status: "error"``
  would let ``{"status": "error", "detail": "x"}`` through). The one exception is a
  ``oneOf``/``anyOf`` whose branches are told apart by a required ``const``/``enum``
  discriminator: at most one branch can match either way, so each branch is closed on its own.
* Subschemas applied in place to the same object (``allOf``/``anyOf``/``oneOf`` branches,
  ``if``/``then``/``else``, ``dependentSchemas``, a ``$ref`` beside other keywords) are not
  closed one by one (each would reject the others' fields). The object that holds them is
  closed instead: ``unevaluatedProperties: false`` in 2019-09/2020-12, which sees through the
  composition; in draft-07, ``additionalProperties: false`` over every field name any of
  them declares. An explicit ``unevaluatedProperties``/``additionalProperties`` there is
  respected and nothing underneath is closed again.
* A ``$def`` reached only through plain ``{"$ref": ...}`` from positions that may be closed is
  closed where it is defined.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from shared.contracts.refs import Resources, at, index, resolve
from shared.contracts.walk import children, pointer

OPEN_MARKER = "x-loopwarden-open"

# Subschemas that apply to the same instance as their parent.
IN_PLACE = frozenset({"allOf", "anyOf", "oneOf", "if", "then", "else", "not", "dependentSchemas", "dependencies"})
# In-place positions where a stricter subschema can make the parent accept more.
_NON_MONOTONE = frozenset({"not", "if", "oneOf"})
# Keywords that live beside "$ref" without making it more than a plain reference.
_PLAIN_REF_SIBLINGS = frozenset(
    {"$ref", "$id", "$schema", "$comment", "$anchor", "title", "description", "default", "examples", "readOnly"}
    | {"writeOnly", "deprecated", "definitions", "$defs"}
)
_FIELD_KEYWORDS = ("properties", "patternProperties")
_EXPLICIT = ("additionalProperties", "unevaluatedProperties")


@dataclass(frozen=True)
class _Ctx:
    frozen: bool  # applied where a stricter schema could accept more: never closed
    in_place: bool  # applied to the same instance as a holder: closed through the holder


def close_schema(schema: dict[str, Any], dialect: str) -> dict[str, Any]:
    """A copy of ``schema`` with undeclared extra fields refused, except where opted out."""
    out: dict[str, Any] = _unshared_copy(schema)
    _Closer(out, dialect).run()
    return out


def _unshared_copy(node: Any) -> Any:
    """A deep copy in which no two places share an object (``copy.deepcopy`` keeps sharing): a subschema
    object used twice by a Python-declared schema is closed, or not, at each place on its own."""
    if isinstance(node, dict):
        return {k: _unshared_copy(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_unshared_copy(v) for v in node]
    return copy.copy(node)


class _Closer:
    def __init__(self, root: dict[str, Any], dialect: str) -> None:
        self.root = root
        self.dialect = dialect
        self.res: Resources = index(root)
        self.contexts: dict[str, set[_Ctx]] = {}
        self.plain_refs: dict[str, str] = {}  # plain-ref holder -> its target

    # --- where each subschema is applied ---------------------------------------------------

    def run(self) -> None:
        self._visit("#", _Ctx(frozen=False, in_place=False))
        # Decide first, edit afterwards: the analysis reads the declared schema.
        edits: list[tuple[str, str]] = []
        for path, ctxs in self.contexts.items():
            node = at(self.root, path)
            if not isinstance(node, dict) or any(c.frozen or c.in_place for c in ctxs):
                continue
            if path in self.plain_refs:
                target = self.plain_refs[path]
                if self._closable(target) or self.dialect == "draft-07":
                    continue  # closed where it is defined (or, in draft-07, cannot be closed here)
                if self._declares_fields(path) and not any(k in node for k in _EXPLICIT):
                    edits.append((path, "unevaluatedProperties"))
                continue
            keyword = self._closing_keyword(path, node)
            if keyword:
                edits.append((path, keyword))
        for path, keyword in edits:
            node = at(self.root, path)
            if keyword == "additionalProperties*":
                self._close_draft07_holder(path, node)
            else:
                node[keyword] = False

    def _visit(self, path: str, ctx: _Ctx) -> None:
        seen = self.contexts.setdefault(path, set())
        if ctx in seen:
            return
        seen.add(ctx)
        node = at(self.root, path)
        if not isinstance(node, dict):
            return
        if node.get(OPEN_MARKER) is True:
            ctx = _Ctx(frozen=True, in_place=ctx.in_place)
        ref = node.get("$ref")
        if isinstance(ref, str):
            found = resolve(self.res, ref, path).target
            if found is not None:
                if self._is_plain_ref(node):
                    self.plain_refs[path] = found
                    self._visit(found, ctx)
                else:
                    self._visit(found, _Ctx(ctx.frozen, in_place=True))
        discriminated = self._discriminated(node)
        for key, parts, _ in children(node):
            if key in ("definitions", "$defs"):
                continue  # applied only through a $ref
            child_path = pointer(path, *parts)
            frozen = ctx.frozen
            if key in _NON_MONOTONE and not (key == "oneOf" and discriminated):
                frozen = True
            if key == "contains" and "maxContains" in node:
                frozen = True
            in_place = key in IN_PLACE and not (key in ("oneOf", "anyOf") and discriminated)
            self._visit(child_path, _Ctx(frozen, in_place))

    def _is_plain_ref(self, node: dict[str, Any]) -> bool:
        if self.dialect == "draft-07":
            return True  # every keyword beside $ref is ignored in draft-07
        return all(k in _PLAIN_REF_SIBLINGS or k.startswith("x-") for k in node) and OPEN_MARKER not in node

    def _discriminated(self, node: dict[str, Any]) -> bool:
        """A oneOf/anyOf of object variants told apart by a required const/enum field, held by nothing else."""
        key = "oneOf" if "oneOf" in node else "anyOf" if "anyOf" in node else None
        if key is None or ("oneOf" in node and "anyOf" in node):
            return False
        branches = node[key]
        if not isinstance(branches, list) or len(branches) < 2:
            return False
        holder_fields = any(k in node for k in (*_FIELD_KEYWORDS, *_EXPLICIT, "$ref", "allOf"))
        holder_fields = holder_fields or any(k in node for k in ("if", "then", "else", "dependentSchemas"))
        if holder_fields or "dependencies" in node:
            return False
        names: set[str] | None = None
        for branch in branches:
            if not isinstance(branch, dict) or not isinstance(branch.get("properties"), dict):
                return False
            required: list[Any] = branch["required"] if isinstance(branch.get("required"), list) else []
            found = {n for n in required if isinstance(n, str) and _values_of(branch["properties"].get(n)) is not None}
            names = found if names is None else names & found
        for name in sorted(names or ()):
            seen: list[Any] = []
            disjoint = True
            for branch in branches:
                values: list[Any] = _values_of(branch["properties"][name]) or []
                if any(v == s for v in values for s in seen):  # Python's == is coarser (1 == 1.0 == True): safe
                    disjoint = False
                    break
                seen.extend(values)
            if disjoint:
                return True
        return False

    # --- what to add where -----------------------------------------------------------------

    def _closable(self, path: str) -> bool:
        """Whether the schema at ``path`` is closed where it is defined."""
        ctxs = self.contexts.get(path, set())
        if not ctxs or any(c.frozen or c.in_place for c in ctxs):
            return False
        node = at(self.root, path)
        return isinstance(node, dict) and self._closing_keyword(path, node) is not None

    def _closing_keyword(self, path: str, node: dict[str, Any]) -> str | None:
        if any(k in node for k in _EXPLICIT) or not self._declares_fields(path):
            return None
        if not any(k in node for k in IN_PLACE - {"not"}) and "$ref" not in node:
            return "additionalProperties"
        if self.dialect != "draft-07":
            return "unevaluatedProperties"
        return "additionalProperties*"  # draft-07: over the names the whole composition declares

    def _in_place_closure(self, path: str) -> list[str] | None:
        """Pointers of every schema applied in place with ``path`` (itself included), or None if one opts out."""
        out: list[str] = []
        stack = [path]
        while stack:
            current = stack.pop()
            if current in out:
                continue
            node = at(self.root, current)
            if not isinstance(node, dict):
                continue
            if node.get(OPEN_MARKER) is True or "$dynamicRef" in node or "$recursiveRef" in node:
                return None  # opted out, or applies a schema only known at validation time
            out.append(current)
            discriminated = self._discriminated(node)
            for key, parts, _ in children(node):
                if key in IN_PLACE and key != "not" and not (key in ("oneOf", "anyOf") and discriminated):
                    stack.append(pointer(current, *parts))
            ref = node.get("$ref")
            if isinstance(ref, str):
                found = resolve(self.res, ref, current).target
                if found is None:
                    return None  # cannot see what it declares: leave the object as declared
                stack.append(found)
        return out

    def _declares_fields(self, path: str) -> bool:
        closure = self._in_place_closure(path)
        if closure is None:
            return False
        return any(
            any(k in node for k in _FIELD_KEYWORDS)
            for node in (at(self.root, p) for p in closure)
            if isinstance(node, dict)
        )

    def _close_draft07_holder(self, path: str, node: dict[str, Any]) -> None:
        closure = self._in_place_closure(path) or []
        names: dict[str, Any] = {}
        patterns: dict[str, Any] = {}
        for p in closure:
            member = at(self.root, p)
            if not isinstance(member, dict):
                continue
            if p != path and member.get("additionalProperties") not in (None, False):
                return  # a member that allows extra fields opts the whole object out
            for name in member.get("properties") or {}:
                names.setdefault(name, {})
            for pat in member.get("patternProperties") or {}:
                patterns.setdefault(pat, {})
        props = node.setdefault("properties", {})
        for name in names:
            props.setdefault(name, {})
        if patterns:
            own = node.setdefault("patternProperties", {})
            for pat in patterns:
                own.setdefault(pat, {})
        node["additionalProperties"] = False


def _values_of(schema: Any) -> list[Any] | None:
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return [schema["const"]]
    if isinstance(schema.get("enum"), list):
        return list(schema["enum"])
    return None
