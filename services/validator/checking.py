"""The validator's rule (pure): a raw tool result and its contract in, the call's ``ToolOutcome`` out.

The check itself is ``shared.contracts.output.check_output``; this module says what the outcome
carries for each of its answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, assert_never

from shared.call_identity import CallIdentity
from shared.contracts.output import OutputCheck, OutputResult, breach_message, check_output
from shared.messages import ToolContract, ToolOutcome, ToolResultRaw

__all__ = ["Checked", "OutputResult", "outcome_of", "stripped_repairs"]


@dataclass
class Checked:
    outcome: ToolOutcome
    result: OutputResult


def stripped_repairs(stripped: list[str]) -> dict[str, Any]:
    """The outcome's account of the undeclared input fields the executor removed (policy ``strip``): a repair
    of the call, listed ahead of any repair of its output."""
    notes = [f"undeclared input field {pointer} stripped" for pointer in stripped]
    return {"stripped": stripped, "repaired": bool(stripped), "repairs": notes}


def outcome_of(contract: ToolContract, raw: ToolResultRaw) -> Checked:
    """``raw``'s output checked against ``contract``, as the outcome the validator publishes."""
    checked = check_output(contract, raw.output, is_text=raw.output_is_text)
    call = CallIdentity.of(raw)
    said: dict[str, Any] = {
        "attempts": raw.attempts,
        "cached": raw.cached,
        "terminal": contract.terminal,
        **stripped_repairs(raw.stripped),
    }
    return Checked(_outcome(call, said, contract, checked), checked.result)


def _outcome(call: CallIdentity, said: dict[str, Any], contract: ToolContract, checked: OutputCheck) -> ToolOutcome:
    match checked.result:
        case "valid":
            return call.outcome(success=True, **{**said, "data": checked.data})
        case "repaired":
            repairs = said["repairs"] + checked.repairs
            return call.outcome(success=True, **{**said, "data": checked.data, "repaired": True, "repairs": repairs})
        case "invalid" | "unparseable":
            return call.outcome(
                success=False,
                **{
                    **said,
                    "repaired": False,  # a stripped input is still said (``stripped``, ``repairs``); the call failed
                    "failure_type": "output_invalid",
                    "recoverable": True,
                    "parsed": checked.result == "invalid",
                    "errors": checked.errors,
                    "schema": contract.output_schema,
                    "error": breach_message(call.tool, checked.errors),
                },
            )
        case _:
            assert_never(checked.result)
