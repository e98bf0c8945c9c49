"""MCP server tools as contracts, pure: what a mounted tool's contract is, how its result reaches the
model, and which failure type each protocol error is. ``mcp_tools`` mounts servers and calls these.

Contracts. Each server tool becomes an ordinary contract and passes the same registration
checks as any other tool. Its output contract is, in this order:

* the server's declared ``outputSchema``: ``structuredContent`` is validated against it (by
  the validator, with repairs and metrics like any tool). Kept *open* as written unless the
  server's entry sets ``closed_output_schemas``, so a server that adds an output field keeps
  working (the SDK's own re-validation is off: ours is the one that counts);
* else a schema the user gave under ``output_schemas``: the result's ``structuredContent``,
  or its text parsed as JSON, is validated against it (closed like any contract the user writes);
* else the result's content itself: text (and other content blocks, described in a line each)
  reaches the model as the server sent it, cut at ``max_result_chars`` and then capped in
  context like any tool output. Most MCP tools return text; none of them needs a schema.

Errors by kind. An ``isError`` result is the tool telling the model what went wrong: a
recoverable ``tool_error`` the model reads, counted and loop-detected like any repeated error.
A JSON-RPC "invalid params" answer is the same. A request timeout is ``timeout`` and a closed
connection (the server died) is ``transient`` for an idempotent tool; for a non-idempotent one
both are ``unknown_outcome`` (the call may have happened; a human decides). Other protocol
errors and client-side crashes are ``fatal``. A non-idempotent call whose result breaks its
output contract already took effect: it fails as a ``tool_error`` that says so and shows what
the server returned, and never invites a repeat. Idempotency comes from the annotations
(``readOnlyHint`` or ``idempotentHint``), overridable per tool with ``idempotent``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Literal

import mcp_types as types
from mcp.shared.exceptions import MCPError

from shared.messages import FailureType, RepairRule, RetryPolicy, ToolContract
from shared.settings import McpServerSpec

SchemaSource = Literal["server", "user", "content"]
SCHEMA_MARK = "x-loopwarden-mcp"  # on a mounted tool's outputSchema: where its output contract comes from
TIMEOUT_MARGIN_S = 2.0  # the executor's own timeout is this much longer: the MCP timeout classifies first

# Started between the executor and the server's command (Linux): the kernel kills the server
# when the executor dies, however it dies; it exits at once if the executor is already gone.
_GUARD = (
    "import ctypes,os,signal,sys\n"
    "ctypes.CDLL(None).prctl(1,signal.SIGKILL,0,0,0)\n"
    "os.getppid()==int(sys.argv[1]) or os._exit(70)\n"
    "os.execvp(sys.argv[2],sys.argv[2:])\n"
)


def guarded_command(command: list[str]) -> list[str]:
    if not sys.platform.startswith("linux"):
        return command
    return [sys.executable, "-S", "-c", _GUARD, str(os.getpid()), *command]


# --- results (pure) ------------------------------------------------------------------------------


def render_content(blocks: list[Any], limit: int) -> str:
    """An MCP result's content as the model reads it: text as sent, other blocks described."""
    parts: list[str] = []
    for b in blocks:
        kind = getattr(b, "type", None)
        if kind == "text":
            parts.append(b.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind} content: {b.mime_type}, about {len(b.data) * 3 // 4} bytes, not shown]")
        elif kind == "resource_link":
            mime = f", {b.mime_type}" if getattr(b, "mime_type", None) else ""
            parts.append(f"[resource link: {b.name} <{b.uri}>{mime}]")
        elif kind == "resource":
            res = b.resource
            text = getattr(res, "text", None)
            if text is not None:
                parts.append(f"[resource <{res.uri}>]\n{text}")
            else:
                parts.append(f"[resource <{res.uri}>: {res.mime_type or 'binary'}, not shown]")
        else:
            parts.append(f"[{kind} content, not shown]")
    text = "\n".join(parts)
    if len(text) > limit:
        text = f"{text[:limit]}\n[result cut: {len(text) - limit} more characters]"
    return text


def output_of(source: SchemaSource, result: types.CallToolResult, limit: int) -> Any:
    """What the validator checks. A ``str`` travels as text that must parse as JSON, so the
    content of a schema-less tool is sent as a JSON string: it parses back to the text itself."""
    text = render_content(result.content or [], limit)
    if source == "content":
        if not text and result.structured_content is not None:
            text = json.dumps(result.structured_content, ensure_ascii=False)
        return json.dumps(text, ensure_ascii=False)
    if result.structured_content is not None:
        return result.structured_content
    return text  # a server that declares a schema should send structuredContent; its text is tried as JSON


def classify_protocol_error(err: MCPError, idempotent: bool) -> tuple[FailureType, str, str | None]:
    """(failure type, detail, effect) for a JSON-RPC error answering ``tools/call``."""
    code, message = err.error.code, err.error.message
    if code == types.INVALID_PARAMS:
        return "tool_error", f"the server refused the call: {message}", "none"
    if code == types.REQUEST_TIMEOUT:
        if idempotent:
            return "timeout", f"the MCP server did not answer in time ({message})", None
        return "unknown_outcome", f"the MCP server did not answer in time ({message}); it may have acted", "may_have"
    if code == types.CONNECTION_CLOSED:
        if idempotent:
            return "transient", "the MCP server's connection closed (the server stopped); it is being restarted", None
        return "unknown_outcome", "the MCP server stopped during the call; it may have acted", "may_have"
    return "fatal", f"the MCP server answered with a protocol error {code}: {message}", None


def is_idempotent(spec: McpServerSpec, tool: types.Tool) -> bool:
    if tool.name in spec.idempotent:
        return spec.idempotent[tool.name]
    hints = tool.annotations
    return bool(hints and (hints.read_only_hint or hints.idempotent_hint))


def contract_for(spec: McpServerSpec, tool: types.Tool) -> tuple[ToolContract, SchemaSource] | str:
    """The contract for one server tool, or why it cannot be mounted."""
    name = f"{spec.prefix}{tool.name}"
    source: SchemaSource
    if tool.output_schema is not None:
        source = "server"
        output_schema = dict(tool.output_schema)
        if not spec.closed_output_schemas:
            output_schema["x-loopwarden-open"] = True
    elif tool.name in spec.output_schemas:
        source, output_schema = "user", dict(spec.output_schemas[tool.name])
    else:
        source = "content"
        output_schema = {
            "type": "string",
            "description": "the tool's content as the server sent it (text; other blocks described)",
        }
    output_schema[SCHEMA_MARK] = source
    idempotent = is_idempotent(spec, tool)
    try:
        contract = ToolContract.model_validate(
            {
                "name": name,
                "description": tool.description or tool.title or f"{tool.name} (MCP server {spec.name})",
                "inputSchema": dict(tool.input_schema),
                "outputSchema": output_schema,
                "idempotent": idempotent,
                "timeout_s": spec.timeout_s + TIMEOUT_MARGIN_S,
                "retry": RetryPolicy(max_attempts=3 if idempotent else 1),
                "repairs": [RepairRule.model_validate(r) for r in spec.repairs.get(tool.name, [])],
                "source": "mcp",
            }
        )
    except ValueError as err:
        return f"MCP tool '{tool.name}' from server '{spec.name}' cannot be described as a contract: {err}"
    return contract, source


def side_effect_message(tool: str, errors: str, returned: str) -> str:
    return (
        f"'{tool}' ran and reported success, so its effect has taken place, but its result breaks the "
        f"tool's output contract:\n{errors}\nWhat the server returned:\n{returned}\n"
        "Do not call it again to get a cleaner result: that would do it a second time. Continue from "
        "this result, or check the current state with a read-only tool."
    )
