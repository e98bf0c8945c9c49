"""The executor's tool registry: every tool passes ``register_contract`` before it can run.

Tools are declared in Python (``@tool``) or as JSON contract files under ``schemas/tools/``
whose ``entrypoint`` names the Python function, or mounted from MCP servers. A contract
that fails its checks is refused alone — logged with the tool, keyword and JSON path —
and the rest of the registry still loads.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared.contracts.dialect import ContractError
from shared.contracts.registration import load_contract_file, register_contract
from shared.messages import FailureType, RepairRule, RetryPolicy, ToolContract

log = logging.getLogger("loopwarden.executor")

ToolFn = Callable[[dict[str, Any], "ToolContext"], Awaitable[Any]]
PostHook = Callable[[Any], Any]
SCHEMAS_DIR = Path(__file__).resolve().parents[2] / "schemas" / "tools"


class ToolFailure(Exception):
    """Raised by a tool to report a typed failure with a message written for the model."""

    def __init__(
        self, kind: FailureType, message: str, retry_after_s: float | None = None, effect: str | None = None
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.retry_after_s = retry_after_s
        self.effect = effect  # none | took_effect | may_have: for a failed non-idempotent call (MCP)


@dataclass
class ToolContext:
    run_id: str
    call_id: str
    attempt: int
    demo_store: Any = None  # a KV bucket for demo side effects (payments)


@dataclass
class HostedTool:
    contract: ToolContract  # as registered: checked dialect, closed objects
    declared: ToolContract  # as written, for lint
    fn: ToolFn
    post_hook: PostHook | None = None  # runs on the output before it is validated


@dataclass
class ToolRegistry:
    default_dialect: str = "2020-12"
    boundaries: dict[str, str] = field(default_factory=dict)  # tool or group name -> boundary
    tools: dict[str, HostedTool] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)

    def register(self, contract: ToolContract, fn: ToolFn, post_hook: PostHook | None = None) -> HostedTool | None:
        # the boundary: the tool's own, else one configured for its name, else for its group
        boundary = (
            contract.boundary
            or self.boundaries.get(contract.name)
            or (self.boundaries.get(contract.group) if contract.group else None)
        )
        if boundary != contract.boundary:
            contract = contract.model_copy(update={"boundary": boundary})
        try:
            registered = register_contract(contract, self.default_dialect)
        except ContractError as err:
            self.refused[contract.name] = str(err)
            log.error("refused tool registration: %s", err)
            return None
        hosted = HostedTool(registered, contract, fn, post_hook)
        self.tools[contract.name] = hosted
        return hosted

    def load_json_dir(self, directory: Path) -> None:
        for path in sorted(directory.glob("*.json")):
            try:
                contract, entrypoint, hook_entrypoint = load_contract_file(path)
            except ValueError as err:
                self.refused[path.stem] = str(err)
                log.error("refused tool contract file: %s", err)
                continue
            if not entrypoint:
                self.refused[contract.name] = f"{path}: no 'entrypoint' naming the function that runs the tool"
                log.error("%s", self.refused[contract.name])
                continue
            try:
                fn = resolve_entrypoint(entrypoint)
                hook = resolve_entrypoint(hook_entrypoint) if hook_entrypoint else None
            except (ImportError, AttributeError, ValueError) as err:
                self.refused[contract.name] = f"{path}: entrypoint cannot be loaded: {err}"
                log.error("%s", self.refused[contract.name])
                continue
            self.register(contract, fn, hook)

    def load_declared(self, declared: list[tuple[ToolContract, ToolFn, PostHook | None]]) -> None:
        for contract, fn, hook in declared:
            self.register(contract, fn, hook)

    def hosted(self, names: frozenset[str] | None) -> dict[str, HostedTool]:
        return {n: t for n, t in self.tools.items() if names is None or n in names}


def resolve_entrypoint(entrypoint: str) -> Any:
    module_name, _, attr = entrypoint.partition(":")
    if not module_name or not attr:
        raise ValueError("expected 'package.module:function'")
    fn = getattr(importlib.import_module(module_name), attr)
    if not callable(fn):
        raise ValueError(f"{entrypoint} is not callable")
    return fn


# --- Python declarations ------------------------------------------------------------------------

DECLARED: list[tuple[ToolContract, ToolFn, PostHook | None]] = []


def tool(
    *,
    name: str,
    description: str,
    input_schema: dict[str, Any],
    output_schema: dict[str, Any],
    idempotent: bool = False,
    timeout_s: float = 10.0,
    retry: RetryPolicy | None = None,
    fallback: str | None = None,
    boundary: str | None = None,
    group: str | None = None,
    terminal: bool = False,
    repairs: list[RepairRule] | None = None,
    post_hook: PostHook | None = None,
) -> Callable[[ToolFn], ToolFn]:
    """Declare a tool contract in Python, next to the function that implements it."""

    def wrap(fn: ToolFn) -> ToolFn:
        contract = ToolContract.model_validate(
            {
                "name": name,
                "description": description,
                "inputSchema": input_schema,
                "outputSchema": output_schema,
                "idempotent": idempotent,
                "timeout_s": timeout_s,
                "retry": retry or RetryPolicy(),
                "fallback": fallback,
                "boundary": boundary,
                "group": group,
                "terminal": terminal,
                "repairs": repairs or [],
                "source": "python",
            }
        )
        DECLARED.append((contract, fn, post_hook))
        return fn

    return wrap
