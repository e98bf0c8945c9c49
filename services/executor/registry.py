"""The executor's tool registry: every tool passes ``register_contract`` before it can run.

Tools are declared in Python (``@tool``) or as JSON contract files under ``schemas/tools/``
whose ``entrypoint`` names the Python function, or mounted from MCP servers. A contract
that fails its checks is refused alone — logged with the tool, keyword and JSON path —
and the rest of the registry still loads.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared.contracts.dialect import ContractError
from shared.contracts.registration import load_contract_file, register_contract
from shared.messages import ToolContract
from shared.tools import Declared, PostHook, ToolFn

log = logging.getLogger("loopwarden.executor")

SCHEMAS_DIR = Path(__file__).resolve().parents[2] / "schemas" / "tools"


@dataclass
class HostedTool:
    contract: ToolContract  # as registered: checked dialect, closed objects
    declared: ToolContract  # as written, for lint
    fn: ToolFn
    post_hook: PostHook | None = None  # runs on the output before it is validated
    text_result: bool = False  # a str result is text (typed tools), not JSON text to parse (the others)


@dataclass
class ToolRegistry:
    default_dialect: str = "2020-12"
    boundaries: dict[str, str] = field(default_factory=dict)  # tool or group name -> boundary
    tools: dict[str, HostedTool] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    module_problems: list[str] = field(default_factory=list)  # tool modules that could not be imported

    def register(
        self, contract: ToolContract, fn: ToolFn, post_hook: PostHook | None = None, text_result: bool = False
    ) -> HostedTool | None:
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
        hosted = HostedTool(registered, contract, fn, post_hook, text_result)
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

    def load_declared(self, declared: Iterable[Declared]) -> None:
        for d in declared:
            self.register(d.contract, d.fn, d.post_hook, d.text_result)

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
