"""Narrow, registered repairs of known contract defects.

A repair runs only where a tool registered it (tool + field path + rule) and only on the
error it is meant for (e.g. a ``type: integer`` failure on ``"3"``). The result is
re-validated, marked repaired and counted, so a tool that breaks its contract every day is
visible instead of quietly papered over. No rule, no repair.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jsonschema.exceptions import ValidationError as JsError

from shared.messages import RepairRule

_INT = re.compile(r"^\s*-?\d+\s*$")
_NUM = re.compile(r"^\s*-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$")


class NoRepair(Exception):
    pass


def _numeric_string_to_integer(value: Any) -> Any:
    if isinstance(value, str) and _INT.match(value):
        return int(value)
    raise NoRepair


def _numeric_string_to_number(value: Any) -> Any:
    if isinstance(value, str) and _NUM.match(value):
        number = float(value)
        return int(number) if number.is_integer() and _INT.match(value) else number
    raise NoRepair


def _string_to_boolean(value: Any) -> Any:
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise NoRepair


def _scalar_to_list(value: Any) -> Any:
    if not isinstance(value, list | dict):
        return [value]
    raise NoRepair


def _null_to_empty_list(value: Any) -> Any:
    if value is None:
        return []
    raise NoRepair


@dataclass(frozen=True)
class RepairSpec:
    fn: Callable[[Any], Any]
    on_keyword: str
    description: str


REPAIRS: dict[str, RepairSpec] = {
    "numeric_string_to_integer": RepairSpec(_numeric_string_to_integer, "type", 'a numeric string "3" -> 3'),
    "numeric_string_to_number": RepairSpec(_numeric_string_to_number, "type", 'a numeric string "2.5" -> 2.5'),
    "string_to_boolean": RepairSpec(_string_to_boolean, "type", '"true"/"false" -> true/false'),
    "scalar_to_list": RepairSpec(_scalar_to_list, "type", "a single value -> a one-item list"),
    "null_to_empty_list": RepairSpec(_null_to_empty_list, "type", "null -> []"),
}


def unknown_rules(rules: list[RepairRule]) -> list[str]:
    return [r.rule for r in rules if r.rule not in REPAIRS]


def _pointer_parts(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.strip("/").split("/") if p != ""]


def _matches(rule_path: str, instance_path: list[str | int]) -> bool:
    parts = _pointer_parts(rule_path)
    if len(parts) != len(instance_path):
        return False
    return all(p == "*" or p == str(i) for p, i in zip(parts, instance_path, strict=True))


def apply_repairs(value: Any, errors: list[JsError], rules: list[RepairRule]) -> tuple[Any, list[str]]:
    """Apply the registered rules to the errors they cover; return the new value and what was done."""
    if not rules:
        return value, []
    repaired = copy.deepcopy(value)
    done: list[str] = []
    for err in errors:
        location = list(err.absolute_path)
        for rule in rules:
            spec = REPAIRS.get(rule.rule)
            if spec is None or err.validator != spec.on_keyword or not _matches(rule.path, location):
                continue
            try:
                fixed = spec.fn(err.instance)
            except NoRepair:
                continue
            repaired = _set(repaired, location, fixed)
            where = "/" + "/".join(str(p) for p in location)
            done.append(f"{rule.rule} at {where}: {err.instance!r} -> {fixed!r}")
            break
    return repaired, done


def _set(doc: Any, location: list[str | int], value: Any) -> Any:
    if not location:
        return value
    node = doc
    for part in location[:-1]:
        node = node[part]
    node[location[-1]] = value
    return doc
