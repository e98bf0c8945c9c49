"""Checking a tool's output against its contract (pure): parse, validate, repair narrowly.

One function for every caller: the validator service maps its answer to a ``ToolOutcome``; the
executor's guard for non-idempotent MCP tools, ``loopwarden check-contract`` and the benchmarks
call it with the output alone, no message around it.

"Normal failures" (not found, empty, denied) are ``oneOf`` variants of the output schema and pass
like any valid output; only a violation of the contract fails the check.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from jsonschema.exceptions import ValidationError as JsError

from shared.contracts.registration import validator_for
from shared.contracts.repair import apply_repairs
from shared.contracts.validation import format_for_model
from shared.messages import SchemaError, ToolContract

OutputResult = Literal["valid", "repaired", "invalid", "unparseable"]


@dataclass(frozen=True)
class OutputCheck:
    """What happened to one output: ``data`` is the output as parsed (and repaired) when it passed,
    ``repairs`` says what was repaired, ``errors`` why it failed."""

    result: OutputResult
    data: Any = None
    repairs: list[str] = field(default_factory=list)
    errors: list[SchemaError] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.result in ("valid", "repaired")


def check_output(contract: ToolContract, output: Any, *, is_text: bool = False) -> OutputCheck:
    """``output`` checked against ``contract``'s output schema; ``is_text``: it is raw text that
    must parse as JSON first."""
    if is_text:
        try:
            output = json.loads(output)
        except (json.JSONDecodeError, TypeError) as err:
            error = SchemaError(
                path="$", keyword="json", message=f"the output is not valid JSON ({err})", got=str(output)[:120]
            )
            return OutputCheck("unparseable", errors=[error])
    validator = validator_for(contract, "output")
    if validator.is_valid(output):
        return OutputCheck("valid", data=output)
    if contract.repairs:
        repaired, done = apply_repairs(output, _leaf_errors(validator.raw_errors(output)), contract.repairs)
        if done and validator.is_valid(repaired):
            return OutputCheck("repaired", data=repaired, repairs=done)
    return OutputCheck("invalid", errors=validator.errors(output))


def breach_message(tool: str, errors: list[SchemaError]) -> str:
    """What the model is told when ``tool``'s output breaks its contract."""
    return f"'{tool}' returned output that breaks its output contract:\n{format_for_model(errors)}"


def _leaf_errors(errors: list[JsError]) -> list[JsError]:
    """Every error including those inside oneOf/anyOf branches (repairs look for theirs)."""
    out: list[JsError] = []
    for err in errors:
        out.append(err)
        if err.context:
            out.extend(_leaf_errors(list(err.context)))
    return out
