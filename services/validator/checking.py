"""Output contracts (pure): parse, validate, repair narrowly, explain.

"Normal failures" (not found, empty, denied) are ``oneOf`` variants of the output schema
and pass like any valid output; only a violation of the contract fails the call.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from jsonschema.exceptions import ValidationError as JsError

from shared.contracts.registration import validator_for
from shared.contracts.repair import apply_repairs
from shared.contracts.validation import format_for_model
from shared.messages import SchemaError, ToolContract, ToolOutcome, ToolResultRaw

Result = Literal["valid", "repaired", "invalid", "unparseable"]


@dataclass
class Checked:
    outcome: ToolOutcome
    result: Result


def _leaf_errors(errors: list[JsError]) -> list[JsError]:
    """Every error including those inside oneOf/anyOf branches (repairs look for theirs)."""
    out: list[JsError] = []
    for err in errors:
        out.append(err)
        if err.context:
            out.extend(_leaf_errors(list(err.context)))
    return out


def stripped_repairs(stripped: list[str]) -> dict[str, Any]:
    """The outcome's account of the undeclared input fields the executor removed (policy ``strip``): a repair
    of the call, listed ahead of any repair of its output."""
    notes = [f"undeclared input field {pointer} stripped" for pointer in stripped]
    return {"stripped": stripped, "repaired": bool(stripped), "repairs": notes}


def check_output(contract: ToolContract, raw: ToolResultRaw) -> Checked:
    base: dict[str, Any] = {
        "run_id": raw.run_id,
        "iteration": raw.iteration,
        "call_id": raw.call_id,
        "attempt_id": raw.attempt_id,
        "tool": raw.tool,
        "requested_tool": raw.requested_tool,
        "arguments": raw.arguments,
        "attempts": raw.attempts,
        "cached": raw.cached,
        "fallback_from": raw.fallback_from,
        "terminal": contract.terminal,
        **stripped_repairs(raw.stripped),
    }
    output = raw.output
    if raw.output_is_text:
        try:
            output = json.loads(raw.output)
        except (json.JSONDecodeError, TypeError) as err:
            error = SchemaError(
                path="$", keyword="json", message=f"the output is not valid JSON ({err})", got=str(raw.output)[:120]
            )
            return Checked(_invalid(base, contract, [error], parsed=False), "unparseable")
    validator = validator_for(contract, "output")
    if validator.is_valid(output):
        return Checked(ToolOutcome.model_validate({**base, "success": True, "data": output}), "valid")
    if contract.repairs:
        repaired, done = apply_repairs(output, _leaf_errors(validator.raw_errors(output)), contract.repairs)
        if done and validator.is_valid(repaired):
            return Checked(
                ToolOutcome.model_validate(
                    {**base, "success": True, "data": repaired, "repaired": True, "repairs": base["repairs"] + done}
                ),
                "repaired",
            )
    return Checked(_invalid(base, contract, validator.errors(output)), "invalid")


def _invalid(
    base: dict[str, Any], contract: ToolContract, errors: list[SchemaError], parsed: bool = True
) -> ToolOutcome:
    return ToolOutcome.model_validate(
        {
            **base,
            "success": False,
            "repaired": False,  # a stripped input is still said (``stripped``, ``repairs``); the call failed
            "failure_type": "output_invalid",
            "recoverable": True,
            "parsed": parsed,
            "errors": errors,
            "schema": contract.output_schema,
            "error": f"'{base['tool']}' returned output that breaks its output contract:\n{format_for_model(errors)}",
        }
    )
