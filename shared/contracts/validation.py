"""Compiled validators and errors written for a model to act on.

Each schema is compiled once (cached by fingerprint) into two engines that assert the
same formats: jsonschema-rs decides pass/fail on the hot path; python-jsonschema runs only
when something failed, to say *what* failed: the JSON path, what was expected, what was
got ("$.priority must be one of low, medium, high, urgent; got 'hi'").
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema_rs
from jsonschema import FormatChecker
from jsonschema import validators as js_validators
from jsonschema.exceptions import ValidationError as JsError

from shared.canonical import digest_of
from shared.contracts.dialect import META_URI
from shared.contracts.ecma import rust_schema, search
from shared.contracts.explainer import explainer_class
from shared.contracts.formats import FORMAT_FUNCTIONS, RS_FORMAT_FUNCTIONS
from shared.messages import SchemaError

MAX_ERRORS = 8
_FORMAT_CHECKER = FormatChecker(formats=())
for _name, _fn in FORMAT_FUNCTIONS.items():
    _FORMAT_CHECKER.checks(_name)(_fn)


def fingerprint(schema: Any) -> str:
    return digest_of(schema)[:16]


class CompiledSchema:
    """One schema, compiled once, in both engines."""

    def __init__(self, schema: dict[str, Any], dialect: str) -> None:
        self.schema = schema
        self.dialect = dialect
        with_dialect = schema if "$schema" in schema else {"$schema": META_URI[dialect], **schema}
        self._fast = jsonschema_rs.validator_for(
            rust_schema(with_dialect),  # patterns spelled out so both engines read them as ECMA-262
            formats=RS_FORMAT_FUNCTIONS,
            validate_formats=True,
            ignore_unknown_formats=True,  # an unknown format is an annotation, in both engines
        )
        cls = explainer_class(js_validators.validator_for(with_dialect))
        self._explainer = cls(with_dialect, format_checker=_FORMAT_CHECKER)

    def is_valid(self, instance: Any) -> bool:
        return bool(self._fast.is_valid(instance))

    def raw_errors(self, instance: Any) -> list[JsError]:
        return sorted(self._explainer.iter_errors(instance), key=_error_order)

    def errors(self, instance: Any, limit: int = MAX_ERRORS) -> list[SchemaError]:
        """Every failure (bounded), each with path, expectation and what was got."""
        if self.is_valid(instance):
            return []
        explained: list[SchemaError] = []
        for err in self.raw_errors(instance):
            explained.extend(e for e in explain(err) if e not in explained)  # one line per distinct error
        if not explained:  # the engines disagree: trust the failing one, but say so
            explained.append(SchemaError(path="$", keyword="schema", message="the value does not satisfy the schema"))
        if len(explained) > limit:
            more = len(explained) - limit
            explained = explained[:limit]
            explained.append(SchemaError(path="$", keyword="more", message=f"and {more} more error(s)"))
        return explained


def _error_order(err: JsError) -> tuple[list[tuple[int, int, str]], str]:
    """Errors by instance path, then keyword; a ``false`` subschema's error has no keyword (None)."""
    path = [(0, p, "") if isinstance(p, int) else (1, 0, str(p)) for p in err.absolute_path]
    return path, "" if err.validator is None else str(err.validator)


_CACHE: dict[str, CompiledSchema] = {}
_CACHE_MAX = 1024


def compiled(schema: dict[str, Any], dialect: str, key: str | None = None) -> CompiledSchema:
    """The compiled validator for ``schema``, compiled at most once per process.

    ``key`` (a contract's fingerprint) makes the lookup a dict hit on the hot path; without
    it the schema is fingerprinted, which costs a serialization per call.
    """
    cache_key = f"{key or fingerprint(schema)}:{dialect}"
    found = _CACHE.get(cache_key)
    if found is None:
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.pop(next(iter(_CACHE)))
        found = _CACHE[cache_key] = CompiledSchema(schema, dialect)
    return found


# --- explanations ---------------------------------------------------------------------------


def show(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_JSON_TYPES = {
    dict: "object",
    list: "array",
    str: "string",
    bool: "boolean",
    int: "integer",
    float: "number",
    type(None): "null",
}


def json_type(value: Any) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)


def _article(type_name: str) -> str:
    return f"an {type_name}" if type_name[:1] in "aeiou" else f"a {type_name}"


def explain(err: JsError) -> list[SchemaError]:
    """Turn one jsonschema error into model-readable errors (oneOf/anyOf pick the closest branch)."""
    path = err.json_path
    val, got = err.validator_value, err.instance
    if err.validator is None:  # a `false` subschema: nothing is allowed here
        return [SchemaError(path=path, keyword="false", message=f"{path} is not allowed here; got {show(got)}")]
    kw = str(err.validator)
    if kw in ("oneOf", "anyOf") and err.context:
        return _explain_branches(err)
    if kw == "enum":
        msg = f"{path} must be one of {', '.join(str(v) for v in val)}; got {show(got)}"
    elif kw == "const":
        msg = f"{path} must be {show(val)}; got {show(got)}"
    elif kw == "type":
        wanted = " or ".join(val) if isinstance(val, list) else str(val)
        msg = f"{path} must be {_article(wanted)}; got {json_type(got)} {show(got)}"
    elif kw == "required":
        missing = [r for r in val if isinstance(got, dict) and r not in got]
        return [
            SchemaError(
                path=path,
                keyword="required",
                message=f"{path} is missing required field '{m}'",
                expected=m,
                got=sorted(got) if isinstance(got, dict) else None,
            )
            for m in missing
        ] or [SchemaError(path=path, keyword=kw, message=f"{path}: {err.message}")]
    elif kw in ("additionalProperties", "unevaluatedProperties"):
        allowed = getattr(err, "allowed", None)
        if not isinstance(allowed, list):
            allowed = sorted((err.schema.get("properties") or {}).keys()) if isinstance(err.schema, dict) else []
        extra = extra_fields(err)
        msg = (
            f"{path} has unexpected field(s) {', '.join(repr(x) for x in extra) or '(unknown)'}; "
            f"allowed fields: {', '.join(allowed) or 'none'}"
        )
        return [SchemaError(path=path, keyword=kw, message=msg, expected=allowed, got=extra)]
    elif kw in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        op = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<"}[kw]
        msg = f"{path} must be {op} {val}; got {show(got)}"
    elif kw in ("minLength", "maxLength"):
        bound = "at least" if kw == "minLength" else "at most"
        msg = f"{path} must be {bound} {val} characters long; got {len(got) if isinstance(got, str) else '?'}"
    elif kw in ("minItems", "maxItems"):
        bound = "at least" if kw == "minItems" else "at most"
        msg = f"{path} must have {bound} {val} items; got {len(got) if isinstance(got, list) else '?'}"
    elif kw == "pattern":
        msg = f"{path} must match the pattern {val}; got {show(got)}"
    elif kw == "format":
        msg = f"{path} must be a valid {val}; got {show(got)}"
    elif kw == "uniqueItems":
        msg = f"{path} must not contain duplicate items"
    elif kw == "multipleOf":
        msg = f"{path} must be a multiple of {val}; got {show(got)}"
    elif kw == "oneOf":
        msg = f"{path} matches more than one allowed variant; it must match exactly one"
    else:
        msg = f"{path}: {err.message}"
    return [SchemaError(path=path, keyword=kw, message=msg, expected=_expected(kw, val), got=_got(got))]


def _expected(kw: str, val: Any) -> Any:
    return val if kw not in ("oneOf", "anyOf", "allOf", "not", "if", "then", "else") else None


def _got(value: Any) -> Any:
    return value if not isinstance(value, dict | list) else json_type(value)


def extra_fields(err: JsError) -> list[str]:
    extras = getattr(err, "extras", None)
    if isinstance(extras, list):  # named by the keyword itself (see explainer.py)
        return [str(e) for e in extras]
    if not isinstance(err.instance, dict) or not isinstance(err.schema, dict):
        return []
    props = err.schema.get("properties") or {}
    patterns = err.schema.get("patternProperties") or {}
    return sorted(k for k in err.instance if k not in props and not any(search(p, k) for p in patterns))


def _explain_branches(err: JsError) -> list[SchemaError]:
    """For a failed oneOf/anyOf, report the branch the value came closest to."""
    by_branch: dict[int, list[JsError]] = {}
    for sub in err.context or []:
        branch = sub.schema_path[0] if sub.schema_path else 0
        by_branch.setdefault(int(branch), []).append(sub)
    branches = err.validator_value if isinstance(err.validator_value, list) else []

    def closeness(item: tuple[int, list[JsError]]) -> tuple[int, int, int]:
        _, errs = item
        # A branch whose discriminator (const/enum) matched is the variant that was meant.
        discriminator_failed = any(
            e.validator in ("const", "enum") and len(e.absolute_path) <= len(err.absolute_path) + 1 for e in errs
        )
        deepest = max((len(e.absolute_path) for e in errs), default=0)
        return (1 if discriminator_failed else 0, len(errs), -deepest)

    if not by_branch:
        return [SchemaError(path=err.json_path, keyword=str(err.validator), message=f"{err.json_path}: {err.message}")]
    idx, errs = min(by_branch.items(), key=closeness)
    label = _branch_label(branches[idx] if idx < len(branches) else None, idx)
    out: list[SchemaError] = []
    for sub in errs:
        for e in explain(sub):
            out.append(e.model_copy(update={"message": f"{e.message} (closest allowed variant: {label})"}))
    return out


def _branch_label(branch: Any, idx: int) -> str:
    if isinstance(branch, dict):
        for prop, sub in (branch.get("properties") or {}).items():
            if isinstance(sub, dict) and "const" in sub:
                return f"{prop}={show(sub['const'])}"
        if "title" in branch:
            return str(branch["title"])
    return f"#{idx}"


def format_for_model(errors: list[SchemaError]) -> str:
    return "\n".join(f"- {e.message}" for e in errors)
