"""What a tool call's undeclared input fields do: the ``refuse`` / ``strip`` / ``open`` policy (pure).

Registration closes a tool's input objects (``closing.py``), so a field the schema does not declare
is *seen*. What happens next is the tool's policy, else the default (``LW_UNDECLARED_FIELDS``):

* ``refuse`` (the default): the call is not executed; the model is told which fields are unexpected
  and may correct itself.
* ``strip``: the undeclared fields are removed and the call runs with what remains, if that is valid.
* ``open``: the schema is honoured as written (it left objects open): the call runs as sent.

A tool states its policy with ``"x-loopwarden-undeclared": "strip"`` on its input schema (a JSON
contract file may say ``"undeclaredFields": "strip"`` at its top level). Whatever the policy, a call
that carried undeclared fields is reported (``Admitted.undeclared``) so the executor can count it.
Only undeclared fields are ever forgiven: a call that breaks the schema otherwise is refused.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Literal, cast, get_args

from shared.contracts.validation import CompiledSchema, extra_fields
from shared.messages import SchemaError

UndeclaredPolicy = Literal["refuse", "strip", "open"]
POLICIES: tuple[str, ...] = get_args(UndeclaredPolicy)
POLICY_KEY = "x-loopwarden-undeclared"
FILE_KEY = "undeclaredFields"  # the same, at the top level of a JSON contract file
_UNDECLARED = ("additionalProperties", "unevaluatedProperties")


@dataclass(frozen=True)
class Admitted:
    """The arguments to run the tool with (``errors`` empty), or why the call is refused."""

    policy: UndeclaredPolicy
    arguments: dict[str, Any]
    errors: list[SchemaError] = field(default_factory=list)
    undeclared: list[str] = field(default_factory=list)  # JSON pointers of the undeclared fields the call carried

    @property
    def outcome(self) -> Literal["refused", "stripped", "kept", "none"]:
        if not self.undeclared:
            return "none"
        if self.errors:
            return "refused"
        return "stripped" if self.policy == "strip" else "kept"


def policy_of(input_schema: dict[str, Any], default: UndeclaredPolicy) -> UndeclaredPolicy:
    """The tool's own policy (``x-loopwarden-undeclared`` on its input schema), else ``default``."""
    own = input_schema.get(POLICY_KEY)
    return cast(UndeclaredPolicy, own) if own in POLICIES else default


def bad_policy(input_schema: dict[str, Any]) -> str | None:
    """Why the schema's policy marker is invalid, or None (checked at registration)."""
    if POLICY_KEY in input_schema and input_schema[POLICY_KEY] not in POLICIES:
        return f"{POLICY_KEY} must be one of {', '.join(POLICIES)}; got {input_schema[POLICY_KEY]!r}"
    return None


def admit(
    validator: CompiledSchema, input_schema: dict[str, Any], arguments: dict[str, Any], default: UndeclaredPolicy
) -> Admitted:
    """Check a call's arguments against the tool's (closed) input schema under its undeclared-field policy."""
    policy = policy_of(input_schema, default)
    errors = validator.errors(arguments)
    if not errors:
        return Admitted(policy, arguments)
    raw = validator.raw_errors(arguments)
    closing = [err for err in raw if err.validator in _UNDECLARED]
    found = [(list(err.absolute_path), name) for err in closing for name in extra_fields(err)]
    undeclared = [_pointer([*path, name]) for path, name in found]
    if not found or policy == "refuse" or len(closing) != len(raw):  # wrong otherwise too: refused as is
        return Admitted(policy, arguments, errors, undeclared)
    stripped = copy.deepcopy(arguments)
    for path, name in found:
        holder: Any = stripped
        for part in path:
            holder = holder[part]
        if isinstance(holder, dict):
            holder.pop(name, None)
    if not validator.is_valid(stripped):
        return Admitted(policy, arguments, errors, undeclared)
    return Admitted(policy, stripped if policy == "strip" else arguments, [], undeclared)


def _pointer(parts: list[Any]) -> str:
    return "/" + "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in parts)
