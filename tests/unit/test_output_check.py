"""One output checker: ``shared.contracts.output.check_output`` is pure and takes the output alone;
the validator maps its answer to a ``ToolOutcome``; nobody builds a message just to call it."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from services.validator.checking import outcome_of
from shared.contracts.output import OutputCheck, check_output
from shared.contracts.registration import register_contract
from shared.messages import ToolContract, ToolResultRaw

ROOT = Path(__file__).resolve().parents[2]

OUTPUT = {
    "type": "object",
    "properties": {"count": {"type": "integer"}, "name": {"type": "string"}},
    "required": ["count"],
}


def contract(**extra: Any) -> ToolContract:
    return register_contract(
        ToolContract.model_validate(
            {
                "name": "count_things",
                "description": "a tool used in tests only",
                "inputSchema": {"type": "object"},
                "outputSchema": OUTPUT,
                **extra,
            }
        )
    )


REPAIRING = {"repairs": [{"path": "/count", "rule": "numeric_string_to_integer"}]}

# (case, contract extras, output, is_text) -> (result, data, repairs, error messages)
TABLE: list[tuple[str, dict[str, Any], Any, bool, OutputCheck]] = [
    ("valid", {}, {"count": 3}, False, OutputCheck("valid", data={"count": 3})),
    ("valid text", {}, '{"count": 3}', True, OutputCheck("valid", data={"count": 3})),
    (
        "repaired",
        REPAIRING,
        {"count": "3"},
        False,
        OutputCheck("repaired", data={"count": 3}, repairs=["numeric_string_to_integer at /count: '3' -> 3"]),
    ),
    ("invalid without a rule", {}, {"count": "3"}, False, OutputCheck("invalid")),
    ("invalid beyond repair", REPAIRING, {"count": "three"}, False, OutputCheck("invalid")),
    ("unparseable", {}, "{count: 3", True, OutputCheck("unparseable")),
    ("text that is not a string", {}, None, True, OutputCheck("unparseable")),
]


@pytest.mark.parametrize(("extra", "output", "is_text", "expected"), [t[1:] for t in TABLE], ids=[t[0] for t in TABLE])
def test_check_output_says_what_happened_to_the_output(
    extra: dict[str, Any], output: Any, is_text: bool, expected: OutputCheck
) -> None:
    checked = check_output(contract(**extra), output, is_text=is_text)
    assert (checked.result, checked.ok) == (expected.result, expected.result in ("valid", "repaired"))
    assert checked.data == expected.data
    assert checked.repairs == expected.repairs
    assert bool(checked.errors) == (not checked.ok)


def test_an_invalid_output_names_the_field_and_an_unparseable_one_says_so() -> None:
    invalid = check_output(contract(), {"count": "3"})
    assert [(e.path, e.keyword) for e in invalid.errors] == [("$.count", "type")]
    unparseable = check_output(contract(), "{count: 3", is_text=True)
    assert unparseable.errors[0].keyword == "json" and "not valid JSON" in unparseable.errors[0].message


def test_a_repair_leaves_the_callers_output_as_it_was() -> None:
    output = {"count": "3"}
    assert check_output(contract(**REPAIRING), output).data == {"count": 3}
    assert output == {"count": "3"}


# --- the validator's outcome, from the same answers ------------------------------------------------------


def raw(output: Any, *, is_text: bool = False, stripped: list[str] | None = None) -> ToolResultRaw:
    return ToolResultRaw(
        run_id="run-1",
        iteration=2,
        call_id="call-1",
        attempt_id="call-1:1",
        tool="count_things",
        requested_tool="count_things",
        arguments={"q": 1},
        output=output,
        output_is_text=is_text,
        attempts=2,
        stripped=stripped or [],
    )


def test_the_validator_outcome_carries_the_call_and_each_answer() -> None:
    valid = outcome_of(contract(), raw({"count": 3}))
    assert valid.result == "valid"
    o = valid.outcome
    assert (o.run_id, o.iteration, o.call_id, o.attempt_id, o.arguments, o.attempts) == (
        "run-1",
        2,
        "call-1",
        "call-1:1",
        {"q": 1},
        2,
    )
    assert o.success and o.data == {"count": 3} and not o.repaired and o.failure_type is None

    repaired = outcome_of(contract(**REPAIRING), raw({"count": "3"}, stripped=["/extra"]))
    assert repaired.result == "repaired" and repaired.outcome.success and repaired.outcome.data == {"count": 3}
    assert repaired.outcome.repairs[0] == "undeclared input field /extra stripped"  # the call's repair first
    assert repaired.outcome.repairs[1] == "numeric_string_to_integer at /count: '3' -> 3" and repaired.outcome.stripped == ["/extra"]

    invalid = outcome_of(contract(), raw({"count": "3"}))
    o = invalid.outcome
    assert invalid.result == "invalid" and not o.success and o.parsed and o.failure_type == "output_invalid"
    assert o.recoverable and o.schema_ == contract().output_schema and o.data is None
    assert o.error is not None and o.error.startswith("'count_things' returned output that breaks its output contract:")

    unparseable = outcome_of(contract(), raw("{count", is_text=True))
    assert unparseable.result == "unparseable" and not unparseable.outcome.parsed
    assert "not valid JSON" in (unparseable.outcome.error or "")


def test_no_service_imports_another_services_output_checker() -> None:
    """The executor's MCP guard (and the CLI and the benches) call the contracts package, not the validator."""
    offenders = []
    for path in [
        *ROOT.glob("services/executor/*.py"),
        ROOT / "loopwarden" / "cli_offline.py",
        ROOT / "bench" / "validation.py",
    ]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("services.validator"):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []
