"""What is stored of a message: its JSON without the fields that hold their default (pure).

A stream or a bucket keeps every byte of every message until the retention sweep; a field that holds an empty
default (``null``, ``false``, ``0``, ``[]``, ``{}``, ``""``) says nothing a reader does not know: a reader that
decodes into the contract (pydantic) fills a missing optional field with that same default, and one that reads
the raw JSON (the run view, an export: ``.get(field)``) reads nothing either way. So what is published and
stored leaves such fields out (``lean_json``): about 3 KB of a demo run's 41 KB.

What is never left out, wherever it holds its default:

* a field typed ``Literal[...]`` with a default: a discriminator (a content block's ``type``, an event's
  ``kind``) by which a reader picks the contract, and a status (``RunStatus``);
* a field whose default is something (``True``, ``1``, ``"auto"``, a model): a reader of the raw JSON would read
  nothing where the contract says something (an outcome's ``attempts`` is 1 when it says nothing);
* a field whose type holds one of those anywhere below it: one model (a run's config) is written lean in turn,
  anything else (a list of history messages, of rubric criteria) whole.

Compatibility: a reader of the last release fills a left-out field with *its* default, so a default must not
change while a release that reads it runs (``tests/unit/test_lean.py`` holds every contract's defaults against
the last release's snapshot). Readers are ``extra="ignore"`` and no field is required that has a default, so
nothing else changes on the wire.

The cost is a few native dumps per model (about 2.5x ``model_dump_json`` for a run's record), not a walk in
Python (15x).
"""

from __future__ import annotations

import json
import types
import typing
from functools import cache
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo


def lean_json(model: BaseModel) -> str:
    """``model`` as JSON (by alias), its fields that hold an empty default left out, but the kept ones
    (``kept_fields``): a kept field that holds a model is written lean in turn, any other whole."""
    cls = type(model)
    kept = kept_fields(cls)
    if not kept:
        return model.model_dump_json(by_alias=True, exclude_defaults=True)
    parts = [model.model_dump_json(by_alias=True, exclude_defaults=True, exclude=set(kept))]
    whole = set(kept)
    for name in kept:
        value = getattr(model, name)
        if isinstance(value, BaseModel) and name in _nested_models(cls):
            whole.discard(name)
            info = cls.model_fields[name]
            parts.append(f"{{{json.dumps(info.alias or name)}:{lean_json(value)}}}")
    if whole:
        parts.append(model.model_dump_json(by_alias=True, include=whole))
    return _merge(parts)


def _merge(objects: list[str]) -> str:
    """JSON objects (as text) as one object: their members one after another."""
    inner = [o[1:-1] for o in objects if o != "{}"]
    return "{" + ",".join(inner) + "}"


@cache
def _nested_models(cls: type[BaseModel]) -> frozenset[str]:
    """The fields of ``cls`` typed as one model (or ``None``): written lean in turn."""
    out = set()
    for name, info in cls.model_fields.items():
        args = [a for a in get_args(info.annotation) if a is not type(None)] or [info.annotation]
        if len(args) == 1 and isinstance(args[0], type) and issubclass(args[0], BaseModel) and info.exclude is not True:
            out.add(name)
    return frozenset(out)


@cache
def kept_fields(cls: type[BaseModel]) -> frozenset[str]:
    """The fields of ``cls`` written whole whatever they hold: a tag, a non-empty string default, or a type
    that holds one below it."""
    return frozenset(name for name, info in cls.model_fields.items() if _kept(info) or _holds_kept(info.annotation))


def _kept(info: FieldInfo) -> bool:
    if info.is_required():
        return False
    if get_origin(info.annotation) is Literal:
        return True
    if info.default_factory is not None:
        try:
            default = info.default_factory()  # type: ignore[call-arg]
        except TypeError:  # a factory that reads the other fields: keep what it makes
            return True
    else:
        default = info.default
    return not _empty(default)


def _empty(value: Any) -> bool:
    """``None``, ``False``, ``0``, ``0.0``, ``""``, ``[]``, ``{}``: what a reader of the raw JSON reads as nothing
    when the field is missing too (``.get(field)`` is falsy either way)."""
    return value is None or (isinstance(value, (bool, int, float, str, list, dict, tuple)) and not value)


def _holds_kept(annotation: Any, seen: frozenset[type] = frozenset()) -> bool:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if annotation in seen:
            return False
        inner = seen | {annotation}
        return any(_kept(f) or _holds_kept(f.annotation, inner) for f in annotation.model_fields.values())
    origin = get_origin(annotation)
    if origin is Literal:
        return False
    if origin is typing.Annotated:
        return _holds_kept(get_args(annotation)[0], seen)
    if origin is None and not isinstance(annotation, types.UnionType):
        return False
    return any(_holds_kept(arg, seen) for arg in get_args(annotation))
