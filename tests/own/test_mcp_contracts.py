"""How an MCP tool's contract and results are made (issue 14): pure functions over real MCP types,
the validator's own check, and ``loopwarden lint`` / ``check-contract`` against real servers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from services.executor.mcp_contracts import classify_protocol_error, contract_for, output_of, render_content
from services.executor.mcp_tools import close_all, mount_mcp_servers
from services.executor.registry import ToolRegistry
from shared.contracts.output import check_output
from shared.contracts.registration import register_contract
from shared.contracts.validation import format_for_model
from shared.messages import ToolContract
from shared.settings import McpServerSpec, Settings
from tests.support.paths import ROOT
from tests.support.timing import bound

SPEC = McpServerSpec(name="s", command=["x"])
PROFILE = types.Tool(
    name="profile",
    input_schema={"type": "object", "properties": {}},
    output_schema={"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    annotations=types.ToolAnnotations(read_only_hint=True),
)
STATUS = types.Tool(name="status", input_schema={"type": "object", "properties": {}})


def registered(spec: McpServerSpec, tool: types.Tool) -> ToolContract:
    made = contract_for(spec, tool)
    assert not isinstance(made, str), made
    return register_contract(made[0])


def check(contract: ToolContract, output: Any) -> Any:
    return check_output(contract, output, is_text=isinstance(output, str))


def test_a_server_schema_is_open_by_default_and_closed_on_request() -> None:
    grown = {"name": "Ada", "timezone": "Europe/Berlin"}  # the server added a field
    assert check(registered(SPEC, PROFILE), grown).ok
    closed = registered(SPEC.model_copy(update={"closed_output_schemas": True}), PROFILE)
    checked = check(closed, grown)
    assert not checked.ok and "unexpected field(s) 'timezone'" in format_for_model(checked.errors)
    assert not check(registered(SPEC, PROFILE), {"name": 3}).ok  # open is not unchecked


def test_a_tool_without_a_schema_takes_its_text_and_a_user_schema_parses_it() -> None:
    text_result = types.CallToolResult(content=[types.TextContent(type="text", text="On branch main\nclean")])
    contract = registered(SPEC, STATUS)
    checked = check(contract, output_of("content", text_result, 1000))
    assert checked.ok and checked.data == "On branch main\nclean"
    user = SPEC.model_copy(update={"output_schemas": {"status": {"type": "object", "required": ["ok"]}}})
    assert contract_for(user, STATUS)[1] == "user"  # type: ignore[index]
    checked = check(registered(user, STATUS), output_of("user", text_result, 1000))
    assert not checked.ok and "not valid JSON" in format_for_model(checked.errors)
    json_result = types.CallToolResult(content=[types.TextContent(type="text", text='{"ok": true}')])
    assert check(registered(user, STATUS), output_of("user", json_result, 1000)).ok


def test_content_blocks_are_rendered_for_the_model_and_cut() -> None:
    blocks: list[Any] = [
        types.TextContent(type="text", text="summary"),
        types.AudioContent(type="audio", data="AAAA" * 4, mime_type="audio/wav"),
        types.EmbeddedResource(
            type="resource", resource=types.BlobResourceContents(uri="file:///a.bin", blob="AA", mime_type="x/y")
        ),
    ]
    assert render_content(blocks, 1000) == (
        "summary\n[audio content: audio/wav, about 12 bytes, not shown]\n[resource <file:///a.bin>: x/y, not shown]"
    )
    assert render_content([types.TextContent(type="text", text="y" * 300)], 100).endswith(
        "\n[result cut: 200 more characters]"
    )


def test_protocol_errors_are_classified_as_they_really_are() -> None:
    def kind(code: int, idempotent: bool) -> tuple[str, str | None]:
        k, _, effect = classify_protocol_error(MCPError(code, "m"), idempotent)
        return k, effect

    assert kind(types.INVALID_PARAMS, False) == ("tool_error", "none")  # refused before running: the model fixes it
    assert kind(types.REQUEST_TIMEOUT, True) == ("timeout", None)
    assert kind(types.REQUEST_TIMEOUT, False) == ("unknown_outcome", "may_have")
    assert kind(types.CONNECTION_CLOSED, True) == ("transient", None)
    assert kind(types.CONNECTION_CLOSED, False) == ("unknown_outcome", "may_have")
    assert kind(types.METHOD_NOT_FOUND, True) == ("fatal", None)


def test_annotations_and_overrides_decide_idempotency() -> None:
    def idempotent(spec: McpServerSpec, **hints: Any) -> bool:
        tool = STATUS.model_copy(update={"annotations": types.ToolAnnotations(**hints) if hints else None})
        return registered(spec, tool).idempotent

    assert idempotent(SPEC, read_only_hint=True) and idempotent(SPEC, idempotent_hint=True)
    assert not idempotent(SPEC) and not idempotent(SPEC, destructive_hint=True)
    assert not idempotent(SPEC.model_copy(update={"idempotent": {"status": False}}), read_only_hint=True)
    contract = registered(SPEC, STATUS)
    assert contract.retry.max_attempts == 1 and contract.timeout_s > SPEC.timeout_s  # our MCP timeout fires first


def cli(*args: str, servers: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LW_MCP_SERVERS": json.dumps(servers)}
    return subprocess.run(
        [sys.executable, "-m", "loopwarden.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=bound(240),
    )


TIME = {
    "name": "time",
    "command": [sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC"],
    "start_timeout_s": 90,  # it must come up, even on a loaded machine
}


def test_lint_starts_mounted_servers_and_reports_their_tools_and_failures() -> None:
    stuck = {
        "name": "stuck",
        "command": [sys.executable, "-m", "services.executor.tools.mcp_lab"],
        "env": {"LAB_HANG": "1"},
        "start_timeout_s": 1,
    }
    proc = cli("lint", servers=[TIME, stuck])
    assert proc.returncode == 1, proc.stdout + proc.stderr  # a server did not start
    assert "REFUSED mcp:stuck: MCP server 'stuck' did not start: no handshake and tool list within 1s" in proc.stdout
    assert (
        "mcp     time/get_current_time -> get_current_time: output the server's outputSchema (kept open); idempotent"
        in proc.stdout
    )
    assert "mcp     time/convert_time -> convert_time:" in proc.stdout
    assert " tool(s) registered, 1 refused" in proc.stdout


def test_check_contract_calls_a_mounted_tool_and_checks_its_result() -> None:
    bad = cli(
        "check-contract",
        "mcp:time/get_current_time",
        "--input",
        '{"timezone": "Europe/Berlln"}',
        "--call",
        servers=[TIME],
    )
    assert bad.returncode == 1 and "input: valid" in bad.stdout
    assert "call: tool_error\n'get_current_time' reported an error:" in bad.stdout and "Invalid timezone" in bad.stdout
    good = cli(
        "check-contract", "mcp:time/get_current_time", "--input", '{"timezone": "Asia/Tokyo"}', "--call", servers=[TIME]
    )
    assert good.returncode == 0 and "call: valid" in good.stdout and '"timezone": "Asia/Tokyo"' in good.stdout


async def test_the_mcp_caller_adds_little_to_the_sdk_round_trip() -> None:
    """Short form of ``python -m bench.mcp`` (the in-process part; the loop part is ``make bench``)."""
    from bench.mcp import client_side

    measured = await client_side(30)
    assert measured["ours_ms"] < measured["sdk_ms"] * 3 + 2, measured  # generous: a loaded 2-core machine


def test_server_names_are_unique_in_the_setting() -> None:
    with pytest.raises(ValidationError, match=r"server names must be unique; repeated: \['time'\]"):
        Settings(mcp_servers=json.dumps([TIME, TIME]))


async def test_a_tool_name_two_servers_share_is_refused_not_shadowed() -> None:
    lab = [sys.executable, "-m", "services.executor.tools.mcp_lab"]
    specs = [
        McpServerSpec(name="one", command=lab, tools=["profile"], start_timeout_s=90),
        McpServerSpec(name="two", command=lab, tools=["profile", "big"], start_timeout_s=90),
    ]
    registry = ToolRegistry()
    mounts = await mount_mcp_servers(registry, specs)
    try:
        assert "profile" in registry.tools and "big" in registry.tools
        assert "the name 'profile' is already registered; give this server a prefix" in registry.refused["two/profile"]
    finally:
        await close_all(mounts)
