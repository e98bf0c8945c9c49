"""One output checker: ``shared.contracts.output.check_output`` is pure and takes the output alone;
the validator maps its answer to a ``ToolOutcome``; nobody builds a message just to call it."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from services.validator.checking import outcome_of
from shared.call_identity import CallIdentity
from shared.contracts.output import OutputCheck, check_output
from shared.contracts.registration import register_contract
from shared.messages import FallbackNote, ToolCall, ToolContract, ToolResultRaw

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
    assert repaired.outcome.repairs[
        1
    ] == "numeric_string_to_integer at /count: '3' -> 3" and repaired.outcome.stripped == ["/extra"]

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


# --- one call identity ---------------------------------------------------------------------------------

CALL = ToolCall(
    run_id="run-1",
    iteration=2,
    call_id="call-1",
    attempt_id="run-1.2.call-1",
    tool="search",
    requested_tool="search",
    arguments={"q": "x"},
)
IDENTITY = ("run_id", "iteration", "call_id", "attempt_id", "tool", "requested_tool", "arguments", "fallback_from")


def identity(message: Any) -> tuple[Any, ...]:
    return tuple(getattr(message, f) for f in IDENTITY)


def test_every_message_built_from_a_call_carries_its_identity() -> None:
    call = CallIdentity.of(CALL)
    raw_ = call.raw({"hits": []}, 3, cached=True)
    failed = call.failed("timeout", "too slow", recoverable=True, attempts=3, boundary=None, will_retry=True)
    assert identity(call.call()) == identity(raw_) == identity(failed) == identity(CALL)
    assert CallIdentity.of(raw_) == CallIdentity.of(failed) == call
    assert (raw_.output, raw_.attempts, raw_.cached) == ({"hits": []}, 3, True)
    assert (failed.success, failed.failure_type, failed.error, failed.recoverable, failed.will_retry) == (
        False,
        "timeout",
        "too slow",
        True,
        True,
    )
    assert failed.boundary is None  # a None extra leaves the field's default
    attempt = call.attempt_failed(2, "transient", "blip", 0.5)
    assert (attempt.run_id, attempt.call_id, attempt.attempt_id, attempt.tool, attempt.attempt, attempt.ok) == (
        "run-1",
        "call-1",
        "run-1.2.call-1",
        "search",
        2,
        False,
    )


def test_a_fallback_is_the_same_call_under_its_own_attempt_id() -> None:
    note = FallbackNote(from_tool="search", to_tool="search_mirror", reason="search timed out")
    fb = CallIdentity.of(CALL).as_fallback("search_mirror", note).call()
    assert (fb.tool, fb.requested_tool, fb.attempt_id, fb.fallback_from) == (
        "search_mirror",
        "search",
        "run-1.2.call-1.fb.search_mirror",
        note,
    )
    assert (fb.run_id, fb.iteration, fb.call_id, fb.arguments) == ("run-1", 2, "call-1", {"q": "x"})
    assert CallIdentity.of(fb).raw(None, 1).fallback_from == note  # carried to the result and the outcome


def test_the_executor_and_validator_builders_do_not_copy_the_identity_by_hand() -> None:
    """A call's identity is spelled once (``shared/call_identity.py``): a new identity field is one edit."""
    builders = ["services/executor/attempts.py", "services/executor/finishing.py", "services/executor/recovery.py"]
    builders.append("services/validator/checking.py")
    copied = []
    for name in builders:
        for node in ast.walk(ast.parse((ROOT / name).read_text())):
            keys = [k.arg for k in node.keywords] if isinstance(node, ast.Call) else []
            if isinstance(node, ast.Dict):
                keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
            if "attempt_id" in keys or "requested_tool" in keys:
                copied.append(f"{name}:{node.lineno}")
    assert copied == []
