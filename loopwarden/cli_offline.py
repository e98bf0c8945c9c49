"""Commands that need no running stack: ``lint``, ``check-contract``, ``check-scenario``.

They read local files only (and start mounted MCP servers where asked), so they work offline; only
``check-scenario --against-stack`` connects, to compare the scenario's tools with what the stack hosts."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from loopwarden.cli_common import FAILED, OK, USAGE, UserError, json_arg, read_text, say
from loopwarden.cli_common import settings as load_cli_settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "lint",
        help="check every tool contract",
        description="Register every tool contract the executor would load (shipped ones, LW_TOOL_CONTRACT_DIR, "
        "LW_MCP_SERVERS); print refusals and lint notes. Exit 1 when one is refused.",
    )
    p.set_defaults(func=cmd_lint)
    p = sub.add_parser(
        "check-contract",
        help="register a tool contract file (or mcp:<server>/<tool>); optionally check an instance",
        description="Register a contract as the executor would; with --input/--output check an instance. "
        "Exit 2 when the contract is refused, 1 when an instance is invalid.",
    )
    p.add_argument("path", metavar="PATH", help="a JSON contract file, or mcp:<server>/<tool> from LW_MCP_SERVERS")
    p.add_argument("--input", metavar="JSON", help="arguments as JSON, or @file.json")
    p.add_argument("--output", metavar="TEXT", help="a tool output as JSON text, or @file.json")
    p.add_argument("--call", action="store_true", help="mcp:<server>/<tool>: call it with --input, check the result")
    p.set_defaults(func=cmd_check_contract)
    p = sub.add_parser(
        "check-scenario",
        help="validate scenario files",
        description="Validate scenario files (each error names its field) and lint their rubrics. Exit 2 on errors. "
        "With --against-stack, also name each tool a scenario calls that the running stack does not host "
        "(one line per tool; exit 1).",
    )
    p.add_argument("paths", nargs="+", metavar="FILE", help="scenario files (YAML)")
    p.add_argument(
        "--against-stack",
        action="store_true",
        help="connect to the stack (LW_NATS_URL, else the one `loopwarden up` recorded) and check its tools",
    )
    p.set_defaults(func=cmd_check_scenario)


def cmd_lint(args: argparse.Namespace) -> int:
    """Registration errors (refused) and softer problems, for every contract the executor would load."""
    from services.executor.app import load_registry
    from shared.contracts.lint import lint_contract

    settings = load_cli_settings()
    registry = load_registry(settings)
    mcp_lines: list[str] = []
    if settings.mcp_server_specs:  # start the mounted MCP servers as the executor would, then stop them
        from services.executor.mcp_tools import inspect_servers

        mcp_lines = asyncio.run(inspect_servers(registry, settings.mcp_server_specs))
    for name, reason in sorted(registry.refused.items()):
        say(f"REFUSED {name}: {reason}")
    for line in mcp_lines:
        say(line)
    issues = [i for t in registry.tools.values() for i in lint_contract(t.declared)]
    for issue in issues:
        say(f"lint    {issue}")
    say(f"{len(registry.tools)} tool(s) registered, {len(registry.refused)} refused, {len(issues)} lint note(s)")
    return FAILED if registry.refused else OK


def cmd_check_contract(args: argparse.Namespace) -> int:
    """Register a contract file as the executor would; optionally check an input or an output."""
    from shared.contracts.dialect import ContractError
    from shared.contracts.output import check_output
    from shared.contracts.registration import load_contract_file, register_contract, validator_for
    from shared.contracts.validation import format_for_model

    if args.call and not args.path.startswith("mcp:"):
        raise UserError("--call needs an mcp:<server>/<tool> path")
    # local input first: a missing file or bad JSON is one line, before anything is registered or started
    instance = json_arg(args.input, "--input") if args.input is not None else None
    output_text: str | None = None
    if args.output is not None:
        output_text = read_text(args.output[1:], "--output") if args.output.startswith("@") else args.output
    if not args.path.startswith("mcp:") and not Path(args.path).is_file():
        raise UserError(f"contract: no such file: {args.path}")
    mcp_tool, called = _mcp_contract(args) if args.path.startswith("mcp:") else (None, None)  # mcp:<server>/<tool>
    if isinstance(mcp_tool, str):
        say(f"REFUSED {mcp_tool}")
        return USAGE
    try:
        if mcp_tool is not None:
            contract = mcp_tool
        else:
            declared, _, _ = load_contract_file(Path(args.path))
            contract = register_contract(declared, load_cli_settings().default_schema_dialect)
    except (ValueError, ContractError) as err:
        say(f"REFUSED {err}")
        return USAGE
    say(f"registered {contract.name} (dialect {contract.dialect}, fingerprint {contract.fingerprint})")
    mcp_text = contract.output_schema.get("x-loopwarden-mcp") == "content"  # its output is text as sent
    status = OK
    if args.input is not None:
        errors = validator_for(contract, "input").errors(instance)
        say("input: valid" if not errors else f"input: invalid\n{format_for_model(errors)}")
        status = status or (FAILED if errors else OK)
    if output_text is not None:
        output = output_text
        checked = check_output(contract, json.dumps(output) if mcp_text else output, is_text=True)
        if checked.ok:
            note = f" ({'; '.join(checked.repairs)})" if checked.repairs else ""
            say(f"output: {checked.result}{note}")
        else:
            say(f"output: {checked.result}\n{format_for_model(checked.errors)}")
            status = status or FAILED
    if args.call:
        status = _mcp_call(args, contract, called) or status
    return status


def _mcp_contract(args: argparse.Namespace) -> tuple[Any, Any]:
    """``mcp:<server>/<tool>``: the contract the executor registers for a mounted MCP tool (or why not),
    and with ``--call`` what one call with ``--input`` returned."""
    from services.executor.mcp_tools import probe
    from services.executor.registry import ToolRegistry

    settings = load_cli_settings()
    server, _, tool = args.path[4:].partition("/")
    specs = [s for s in settings.mcp_server_specs if s.name == server]
    if not specs or not tool:
        return f"{args.path}: expected mcp:<server>/<tool> with <server> in LW_MCP_SERVERS", None
    registry = ToolRegistry(default_dialect=settings.default_schema_dialect, boundaries=dict(settings.boundaries))
    call_args = (json_arg(args.input, "--input") if args.input is not None else {}) if args.call else None
    lines, called = asyncio.run(probe(registry, specs[0], tool, call_args))
    for line in lines:
        say(line)
    name = f"{specs[0].prefix}{tool}"
    if name in registry.tools:
        return registry.tools[name].contract, called
    return registry.refused.get(name) or registry.refused.get(f"mcp:{server}") or f"{args.path}: no such tool", None


def _mcp_call(args: argparse.Namespace, contract: Any, called: Any) -> int:
    """``--call``: check what the MCP tool returned, as a run would."""
    from shared.contracts.output import check_output
    from shared.contracts.validation import format_for_model
    from shared.tools import ToolFailure

    if isinstance(called, ToolFailure):
        say(f"call: {called.kind}{f' (effect: {called.effect})' if called.effect else ''}\n{called}")
        return 1
    checked = check_output(contract, called, is_text=isinstance(called, str))
    data = checked.data
    shown = data if isinstance(data, str) else json.dumps(data if checked.ok else called)
    say(f"call: {checked.result}\n{shown[:2000]}")
    if not checked.ok:
        say(format_for_model(checked.errors))
        return FAILED
    return OK


def cmd_check_scenario(args: argparse.Namespace) -> int:
    from loopwarden.cli_common import load_scenario_file
    from shared.rubric import lint_rubric

    status = OK
    checked: list[tuple[str, Any]] = []
    for path in args.paths:
        try:
            scenario = load_scenario_file(path)
        except UserError as err:
            say(str(err), err=True)
            status = USAGE
            continue
        found = lint_rubric(scenario.rubric) if scenario.rubric else None
        for msg in found.errors if found else []:
            say(f"{path}: rubric refused: {msg}", err=True)
            status = USAGE
        for msg in found.flags if found else []:
            say(f"{path}: rubric flag: {msg}")
        say(f"{path}: ok ({len(scenario.planner)} planner turn(s), {len(scenario.judge)} judge repl(ies))")
        checked.append((path, scenario))
    if args.against_stack and checked:
        missing = asyncio.run(_missing_per_file(checked))
        for path, tools in missing:
            for line in missing_lines(path, tools):
                say(line, err=True)
        if missing and status == OK:
            status = FAILED
    return status


async def _missing_per_file(checked: list[tuple[str, Any]]) -> list[tuple[str, list[str]]]:
    from loopwarden.cli_common import connected

    found = []
    async with connected() as client:
        for path, scenario in checked:
            if missing := await client.guard(missing_tools(client, scenario.called_tools())):
                found.append((path, missing))
    return found


async def missing_tools(client: Any, tools: list[str]) -> list[str]:
    """Those of ``tools`` the running stack does not host: no executor registered their contract
    (``lw_contracts``), or no running replica takes their calls, as the planner decides it
    (``services/planner/hosting.py``)."""
    from nats.js.errors import NotFoundError

    from services.planner.hosting import Hosting
    from shared import subjects as S
    from shared.messages import ToolContract

    async def probe(tool: str) -> bool | None:
        try:
            info = await client.bus.js.consumer_info(S.STREAM_CMD, S.executor_durable(tool), timeout=2)
        except NotFoundError:
            return False
        except Exception:  # the server cannot say now: as the planner, count it hosted
            return None
        return bool(info.num_waiting or info.num_ack_pending)

    registered = {c.name for c in (await client.bus.kv_values(S.KV_CONTRACTS, ToolContract)).values()}
    gone = await Hosting(probe).unhosted(t for t in tools if t in registered)
    return [t for t in tools if t not in registered or t in gone]


def missing_lines(path: str, tools: list[str]) -> list[str]:
    """One line per tool a scenario calls that the stack does not host."""
    return [
        f"{path}: calls {tool}, which no executor of the running stack hosts (start the stack with its "
        "contract, module or MCP server: LW_TOOL_CONTRACT_DIR, LW_TOOL_MODULES, LW_MCP_SERVERS)"
        for tool in tools
    ]
