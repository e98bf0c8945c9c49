"""An MCP server (stdio) for the lifecycle and result-kind tests: ``python -m services.executor.tools.mcp_lab``.

Tools: ``charge`` (not idempotent; ``crash`` kills the server mid-call), ``write_note`` (not
idempotent: appends a line to ``$LAB_NOTES``; text starting with ``bad`` makes it answer with
a ``note_id`` that breaks its declared outputSchema *after* the write), ``profile`` (declares an
outputSchema and answers with one more field than it declares, as a server that grew a field
does), ``snapshot`` (no outputSchema: text, an image, a resource link and an embedded text
resource), ``sleep`` (answers after ``seconds``) and ``big`` (``chars`` characters of text).

Start-up: ``LAB_START_DELAY_S`` delays the handshake; ``LAB_HANG=1`` never answers it;
``LAB_HANG_UNLESS=<path>`` never answers it while that file does not exist (a server that
fails at the executor's start and comes up on a later restart); ``LAB_LINGER=1`` keeps the
process alive for two minutes after its stdin closes. Any extra command-line argument is
ignored (tests use one to find the process in /proc).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server

OBJ = "object"
TOOLS = [
    types.Tool(
        name="write_note",
        description="Append a note to the notebook; returns its id. Not idempotent: every call writes.",
        input_schema={"type": OBJ, "properties": {"text": {"type": "string"}}, "required": ["text"]},
        output_schema={"type": OBJ, "properties": {"note_id": {"type": "integer"}}, "required": ["note_id"]},
        annotations=types.ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False),
    ),
    types.Tool(
        name="charge",
        description="Charge an amount. Not idempotent. crash=true makes the server die in the middle of the call.",
        input_schema={
            "type": OBJ,
            "properties": {"cents": {"type": "integer"}, "crash": {"type": "boolean"}},
            "required": ["cents"],
        },
        annotations=types.ToolAnnotations(read_only_hint=False, destructive_hint=True),
    ),
    types.Tool(
        name="profile",
        description="The user's profile.",
        input_schema={"type": OBJ, "properties": {}},
        output_schema={"type": OBJ, "properties": {"name": {"type": "string"}}, "required": ["name"]},
        annotations=types.ToolAnnotations(read_only_hint=True),
    ),
    types.Tool(
        name="snapshot",
        description="A snapshot of the dashboard: a summary, a chart and links.",
        input_schema={"type": OBJ, "properties": {}},
        annotations=types.ToolAnnotations(read_only_hint=True),
    ),
    types.Tool(
        name="sleep",
        description="Answer after some seconds.",
        input_schema={"type": OBJ, "properties": {"seconds": {"type": "number"}}, "required": ["seconds"]},
        annotations=types.ToolAnnotations(read_only_hint=True),
    ),
    types.Tool(
        name="big",
        description="A long text.",
        input_schema={"type": OBJ, "properties": {"chars": {"type": "integer"}}, "required": ["chars"]},
        annotations=types.ToolAnnotations(read_only_hint=True),
    ),
]


def write_note(line: str) -> int:
    """The side effect: append the line; the number of notes written so far."""
    notes = Path(os.environ.get("LAB_NOTES", "/dev/null"))
    with notes.open("a", encoding="utf-8") as f:
        f.write(line + "\n")
    return 0 if notes == Path("/dev/null") else len(notes.read_text(encoding="utf-8").splitlines())


def text(value: str) -> list[types.ContentBlock]:
    return [types.TextContent(type="text", text=value)]


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    args = params.arguments or {}
    if params.name == "write_note":
        n = write_note(str(args["text"]))
        note_id: Any = f"n-{n}" if str(args["text"]).startswith("bad") else n
        return types.CallToolResult(content=text(f"note {note_id} saved"), structured_content={"note_id": note_id})
    if params.name == "charge":
        if args.get("crash"):
            os._exit(3)  # the process dies with the request in flight
        return types.CallToolResult(content=text(f"charged {args['cents']} cents"))
    if params.name == "profile":
        data = {"name": "Ada", "timezone": "Europe/Berlin"}  # 'timezone' is newer than the declared schema
        return types.CallToolResult(content=text('{"name": "Ada"}'), structured_content=data)
    if params.name == "snapshot":
        return types.CallToolResult(
            content=[
                types.TextContent(type="text", text="3 services up, 1 degraded (search)."),
                types.ImageContent(type="image", data="iVBORw0KGgo" * 10, mime_type="image/png"),
                types.ResourceLink(type="resource_link", name="runbook", uri="file:///runbooks/search.md"),
                types.EmbeddedResource(
                    type="resource",
                    resource=types.TextResourceContents(uri="memo://oncall", text="on call: Grace"),
                ),
            ]
        )
    if params.name == "sleep":
        await anyio.sleep(float(args["seconds"]))
        return types.CallToolResult(content=text("slept"))
    if params.name == "big":
        return types.CallToolResult(content=text("x" * int(args["chars"])))
    return types.CallToolResult(content=text(f"unknown tool {params.name}"), is_error=True)


server = Server("lab", on_list_tools=list_tools, on_call_tool=call_tool)


async def main() -> None:
    await anyio.sleep(float(os.environ.get("LAB_START_DELAY_S", "0")))
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())
    if os.environ.get("LAB_LINGER") == "1":  # a server that does not exit when its stdin closes
        await anyio.sleep(120)


if __name__ == "__main__":
    while os.environ.get("LAB_HANG") == "1":  # never reads stdin: no handshake, ever
        time.sleep(3600)
    gate = os.environ.get("LAB_HANG_UNLESS")
    while gate and not os.path.exists(gate):  # no handshake until the file appears
        time.sleep(0.1)
    anyio.run(main)
