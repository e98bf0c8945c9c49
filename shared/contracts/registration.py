"""Registering a tool contract: fail fast on a bad schema, then compile once.

``register_contract`` is the gate every tool passes — Python-declared, JSON-file and MCP
tools alike: the dialect is resolved, foreign and unknown keywords are refused with their
path, the meta-schema is checked, objects are closed by default, both schemas compile,
and repair rules must name registered repairs. A JSON file may hold the tool in our shape,
OpenAI's function format or Anthropic's tool format (``ecosystem.py``); an input schema's
undeclared-field policy (``undeclared.py``) must be one we know.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError

from shared.contracts.closing import close_schema
from shared.contracts.dialect import ContractError, SchemaProblem, check_schema
from shared.contracts.ecosystem import ToolFormatError, to_contract_fields
from shared.contracts.repair import unknown_rules
from shared.contracts.undeclared import POLICY_KEY, bad_policy
from shared.contracts.validation import CompiledSchema, compiled, fingerprint
from shared.describe import describe
from shared.messages import ToolContract


def register_contract(contract: ToolContract, default_dialect: str = "2020-12") -> ToolContract:
    """The contract with checked dialect and closed schemas, or ``ContractError``."""
    dialects = []
    effective: dict[str, dict[str, Any]] = {}
    for which, schema in (("inputSchema", contract.input_schema), ("outputSchema", contract.output_schema)):
        dialect, problems = check_schema(schema, default_dialect)
        if problems:
            raise ContractError(contract.name, which, problems[0])
        policy_problem = bad_policy(schema) if which == "inputSchema" else None
        if policy_problem:
            raise ContractError(contract.name, which, SchemaProblem(POLICY_KEY, f"#/{POLICY_KEY}", policy_problem))
        if which == "inputSchema" and schema.get("type") != "object":
            raise ContractError(
                contract.name,
                which,
                SchemaProblem("type", "#/type", 'tool arguments are a JSON object: inputSchema needs "type": "object"'),
            )
        closed = close_schema(schema, dialect)
        try:
            compiled(closed, dialect)
        except Exception as err:  # a schema the compiler rejects is as bad as an invalid one
            raise ContractError(
                contract.name, which, SchemaProblem("(schema)", "#", f"does not compile: {err}")
            ) from err
        effective[which] = closed
        dialects.append(dialect)
    bad_rules = unknown_rules(contract.repairs)
    if bad_rules:
        raise ContractError(
            contract.name,
            "repairs",
            SchemaProblem("rule", "#/repairs", f"unknown repair rule(s): {', '.join(bad_rules)}"),
        )
    return contract.model_copy(
        update={
            "input_schema": effective["inputSchema"],
            "output_schema": effective["outputSchema"],
            "dialect": dialects[1] if dialects[0] == dialects[1] else f"{dialects[0]}/{dialects[1]}",
            "fingerprint": fingerprint(
                [effective["inputSchema"], effective["outputSchema"], [r.model_dump() for r in contract.repairs]]
            ),
        }
    )


def dialect_of_contract(contract: ToolContract, which: str) -> str:
    """The dialect of a registered contract's input or output schema."""
    parts = (contract.dialect or "2020-12").split("/")
    return parts[0] if which == "input" or len(parts) == 1 else parts[1]


def validator_for(contract: ToolContract, which: Literal["input", "output"]) -> CompiledSchema:
    """The compiled validator of a registered contract's input or output schema (cached by fingerprint)."""
    schema = contract.input_schema if which == "input" else contract.output_schema
    key = f"{contract.fingerprint}:{which}" if contract.fingerprint else None
    return compiled(schema, dialect_of_contract(contract, which), key)


def load_contract_file(path: Path) -> tuple[ToolContract, str | None, str | None]:
    """A contract declared as JSON (our shape, OpenAI's function format or Anthropic's tool format):
    the contract, an ``entrypoint`` and an optional ``postHook``."""
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON: {err.msg} at line {err.lineno} column {err.colno}") from err
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a contract file holds one JSON object")
    entrypoint = data.pop("entrypoint", None)
    post_hook = data.pop("postHook", None)
    try:
        fmt, fields = to_contract_fields(data)
    except ToolFormatError as err:
        raise ValueError(f"{path}: {err}") from None
    try:
        contract = ToolContract.model_validate({**fields, "source": "json"})
    except ValidationError as err:
        if fmt != "loopwarden":
            raise ValueError(f"{path} ({fmt} tool format): {describe(err)}") from err
        raise ValueError(f"{path}: {describe(err)}") from err
    return contract, entrypoint, post_hook
