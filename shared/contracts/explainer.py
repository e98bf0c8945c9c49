"""python-jsonschema, made to read patterns as ECMA-262 like the fast engine does.

python-jsonschema matches ``pattern``/``patternProperties`` with Python's ``re``, so
``\\p{Letter}`` or ``(?<name>...)`` would crash it and ``\\d`` would match any Unicode digit.
The keywords that read patterns (``pattern``, ``patternProperties``, ``additionalProperties``
and ``unevaluatedProperties``, which must know which fields a pattern covered) are
replaced here by the same keywords matching with :func:`shared.contracts.ecma.search`.

An ``unevaluatedProperties: false`` failure carries the unexpected field names on the
error (``extras``), so the explanation does not have to parse a message.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from typing import Any

from jsonschema import validators as js_validators
from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator
from referencing.jsonschema import lookup_recursive_ref

from shared.contracts.ecma import search


def _matches_any(patterns: Any, name: str) -> bool:
    return any(search(p, name) for p in patterns or {})


def _pattern(validator: Any, patrn: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not search(patrn, instance):
        yield ValidationError(f"{instance!r} does not match {patrn!r}")


def _pattern_properties(validator: Any, pp: dict[str, Any], instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in pp.items():
        for k, v in instance.items():
            if search(pattern, k):
                yield from validator.descend(v, subschema, path=k, schema_path=pattern)


def _additional(instance: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    properties = schema.get("properties", {})
    patterns = schema.get("patternProperties", {})
    return [k for k in instance if k not in properties and not _matches_any(patterns, k)]


def _additional_properties(validator: Any, ap: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    extras = _additional(instance, schema)
    if validator.is_type(ap, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], ap, path=extra)
    elif not ap and extras:
        listed = ", ".join(repr(e) for e in sorted(extras))
        error = ValidationError(f"Additional properties are not allowed ({listed} unexpected)")
        error.extras = sorted(extras)
        yield error


def _valid(errors: Iterator[ValidationError]) -> bool:
    return next(errors, None) is None


def _evaluated_keys(validator: Any, instance: dict[str, Any], schema: Any) -> set[str]:
    """The fields ``schema`` evaluates in place (2019-09/2020-12 annotation semantics)."""
    if validator.is_type(schema, "boolean"):
        return set()
    keys: set[str] = set()
    for ref_keyword in ("$ref", "$dynamicRef", "$recursiveRef"):
        ref = schema.get(ref_keyword)
        if ref is None:
            continue
        if ref_keyword == "$recursiveRef":
            resolved = lookup_recursive_ref(validator._resolver)
        else:
            resolved = validator._resolver.lookup(ref)
        inner = validator.evolve(schema=resolved.contents, _resolver=resolved.resolver)
        keys |= _evaluated_keys(inner, instance, resolved.contents)
    properties = schema.get("properties")
    if validator.is_type(properties, "object"):
        keys |= properties.keys() & instance.keys()
    for keyword in ("additionalProperties", "unevaluatedProperties"):
        sub = schema.get(keyword)
        if sub is not None:
            keys |= {k for k, v in instance.items() if _valid(validator.descend(v, sub))}
    if "patternProperties" in schema:
        keys |= {k for k in instance if _matches_any(schema["patternProperties"], k)}
    for name, sub in (schema.get("dependentSchemas") or {}).items():
        if name in instance:
            keys |= _evaluated_keys(validator, instance, sub)
    for keyword in ("allOf", "oneOf", "anyOf"):
        for sub in schema.get(keyword, []):
            if _valid(validator.descend(instance, sub)):
                keys |= _evaluated_keys(validator, instance, sub)
    if "if" in schema:
        if validator.evolve(schema=schema["if"]).is_valid(instance):
            keys |= _evaluated_keys(validator, instance, schema["if"])
            if "then" in schema:
                keys |= _evaluated_keys(validator, instance, schema["then"])
        elif "else" in schema:
            keys |= _evaluated_keys(validator, instance, schema["else"])
    return keys


def _unevaluated_properties(validator: Any, up: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    evaluated = _evaluated_keys(validator, instance, schema)
    bad = [
        k
        for k in instance
        if k not in evaluated and not _valid(validator.descend(instance[k], up, path=k, schema_path=k))
    ]
    if bad:
        listed = ", ".join(repr(e) for e in sorted(bad))
        if up is False:
            error = ValidationError(f"Unevaluated properties are not allowed ({listed} unexpected)")
        else:
            error = ValidationError(f"Unevaluated properties are not valid under the given schema ({listed})")
        error.extras = sorted(bad)
        error.allowed = sorted(_declared_names(validator, schema, depth=0))
        yield error


def _declared_names(validator: Any, schema: Any, depth: int) -> set[str]:
    """The field names ``schema`` and everything it applies in place declare (for the explanation)."""
    if not isinstance(schema, dict) or depth > 16:
        return set()
    names = set(schema.get("properties") or {})
    for keyword in ("allOf", "anyOf", "oneOf"):
        for sub in schema.get(keyword) or []:
            names |= _declared_names(validator, sub, depth + 1)
    for keyword in ("if", "then", "else"):
        names |= _declared_names(validator, schema.get(keyword), depth + 1)
    for sub in (schema.get("dependentSchemas") or {}).values():
        names |= _declared_names(validator, sub, depth + 1)
    ref = schema.get("$ref")
    if isinstance(ref, str):
        try:
            resolved = validator._resolver.lookup(ref)
        except Exception:  # an explanation never fails on a reference it cannot follow
            return names
        inner = validator.evolve(schema=resolved.contents, _resolver=resolved.resolver)
        names |= _declared_names(inner, resolved.contents, depth + 1)
    return names


_MODERN = ("https://json-schema.org/draft/2019-09/schema", "https://json-schema.org/draft/2020-12/schema")


@cache
def explainer_class(base: type[Validator]) -> type[Validator]:
    """``base`` (a python-jsonschema validator class) with ECMA-262 pattern keywords."""
    keywords: dict[str, Any] = {
        "pattern": _pattern,
        "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties,
    }
    if base.META_SCHEMA.get("$schema", "").rstrip("#") in _MODERN or "unevaluatedProperties" in base.VALIDATORS:
        keywords["unevaluatedProperties"] = _unevaluated_properties
    extended: type[Validator] = js_validators.extend(base, keywords)
    return extended
