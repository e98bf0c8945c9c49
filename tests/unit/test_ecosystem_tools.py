"""Tool definitions in OpenAI and Anthropic format, and the undeclared-field policy, as pure functions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shared.contracts.dialect import ContractError
from shared.contracts.registration import load_contract_file, register_contract, validator_for
from shared.contracts.undeclared import admit
from shared.pricing import model_price

PARAMS = {"type": "object", "properties": {"flight": {"type": "string"}}, "required": ["flight"]}
OUT = {"type": "object"}


def write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "tool.json"
    path.write_text(json.dumps(data))
    return path


def test_the_three_formats_register_as_the_same_contract(tmp_path: Path) -> None:
    ours = {"name": "book", "description": "Book.", "inputSchema": PARAMS, "outputSchema": OUT}
    openai = {"type": "function", "function": {"name": "book", "description": "Book.", "parameters": PARAMS}}
    anthropic = {"name": "book", "description": "Book.", "input_schema": PARAMS}
    registered = []
    for data in (ours, {**openai, "outputSchema": OUT}, {**anthropic, "outputSchema": OUT}):
        contract, _, _ = load_contract_file(write(tmp_path, {**data, "entrypoint": "m:f"}))
        registered.append(register_contract(contract))
    assert len({c.fingerprint for c in registered}) == 1
    assert registered[0].input_schema["additionalProperties"] is False  # closed, as today


def test_an_ecosystem_tool_without_output_schema_accepts_any_output(tmp_path: Path) -> None:
    openai = {"type": "function", "function": {"name": "book", "description": "Book.", "parameters": PARAMS}}
    contract, _, _ = load_contract_file(write(tmp_path, openai))
    assert validator_for(register_contract(contract), "output").is_valid("any text")


def test_a_bad_definition_is_refused_in_one_line(tmp_path: Path) -> None:
    bad = {"type": "function", "function": {"name": "book", "parameters": PARAMS, "strictly": True}}
    with pytest.raises(ValueError, match="unknown field"):
        load_contract_file(write(tmp_path, bad))
    with pytest.raises(ContractError, match="x-loopwarden-undeclared must be one of refuse, strip, open"):
        contract, _, _ = load_contract_file(
            write(tmp_path, {"name": "b", "input_schema": PARAMS, "undeclaredFields": "drop"})
        )
        register_contract(contract)


@pytest.mark.parametrize(
    ("policy", "runs_with", "outcome"),
    [
        ("refuse", None, "refused"),
        ("strip", {"flight": "LW1"}, "stripped"),
        ("open", {"flight": "LW1", "seat": "1A"}, "kept"),
    ],
)
def test_each_policy_on_an_undeclared_field(tmp_path: Path, policy: str, runs_with: Any, outcome: str) -> None:
    contract, _, _ = load_contract_file(
        write(tmp_path, {"name": "b", "input_schema": PARAMS, "undeclaredFields": policy})
    )
    registered = register_contract(contract)
    admitted = admit(
        validator_for(registered, "input"), registered.input_schema, {"flight": "LW1", "seat": "1A"}, "refuse"
    )
    assert admitted.undeclared == ["/seat"] and admitted.outcome == outcome
    assert (admitted.arguments if not admitted.errors else None) == runs_with


def test_the_default_policy_applies_to_a_tool_without_its_own(tmp_path: Path) -> None:
    contract = register_contract(load_contract_file(write(tmp_path, {"name": "b", "input_schema": PARAMS}))[0])
    admitted = admit(validator_for(contract, "input"), contract.input_schema, {"flight": "x", "seat": 1}, "strip")
    assert admitted.policy == "strip" and admitted.arguments == {"flight": "x"}


def test_openai_prices_match_the_longest_name_and_read_the_cache_at_the_cached_rate() -> None:
    assert model_price("gpt-4o-mini-2024-07-18").input == 0.15
    assert model_price("gpt-4o-2024-08-06").input == 2.50
    p = model_price("gpt-4o")
    assert p.cache_read == 1.25 and p.cache_write == p.input  # no cache-write surcharge
