"""A small MCP server (stdio) for the demo and the tests: ``python -m services.executor.tools.mcp_orders``.

Its tools exercise the paths an MCP mount must handle: structured output with a declared
outputSchema (``lookup_order``, with a ``not_found`` variant), a legacy tool that returns
JSON as text and declares no outputSchema (``inventory_report``; its count is a numeric
string, and sku ``BROKEN`` returns non-JSON text), a tool that reports ``isError``
(``cancel_order``), and a tool whose schema mixes dialects (``export_orders``), which the
executor must refuse at registration.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server

ORDERS = {1001: {"status": "shipped", "total_cents": 4200}, 1002: {"status": "pending", "total_cents": 1599}}
STOCK = {"A-1": 12, "B-7": 0}

TOOLS = [
    types.Tool(
        name="lookup_order",
        description="Look up an order by id: its status and total. Returns status not_found for unknown ids.",
        input_schema={
            "type": "object",
            "properties": {"order_id": {"type": "integer", "minimum": 1, "description": "numeric order id"}},
            "required": ["order_id"],
        },
        output_schema={
            "type": "object",
            "oneOf": [
                {
                    "type": "object",
                    "properties": {
                        "status": {"enum": ["shipped", "pending"]},
                        "order_id": {"type": "integer"},
                        "total_cents": {"type": "integer"},
                    },
                    "required": ["status", "order_id", "total_cents"],
                },
                {
                    "type": "object",
                    "properties": {"status": {"const": "not_found"}, "order_id": {"type": "integer"}},
                    "required": ["status", "order_id"],
                },
            ],
        },
        annotations=types.ToolAnnotations(read_only_hint=True),
    ),
    types.Tool(
        name="inventory_report",
        description="Stock level for a SKU, from the legacy inventory system (plain-text JSON reply).",
        input_schema={
            "type": "object",
            "properties": {"sku": {"type": "string", "description": "e.g. A-1"}},
            "required": ["sku"],
        },
        annotations=types.ToolAnnotations(read_only_hint=True),
    ),
    types.Tool(
        name="cancel_order",
        description="Cancel an order. Fails for orders that already shipped.",
        input_schema={
            "type": "object",
            "properties": {"order_id": {"type": "integer", "description": "order id"}},
            "required": ["order_id"],
        },
        output_schema={"type": "object", "properties": {"cancelled": {"type": "boolean"}}, "required": ["cancelled"]},
    ),
    types.Tool(
        name="export_orders",
        description="Export orders as rows (its schema mixes draft-07 and 2020-12 on purpose).",
        input_schema={
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "properties": {"columns": {"type": "array", "prefixItems": [{"type": "string"}]}},
        },
        output_schema={"type": "object"},
    ),
]


async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    args = params.arguments or {}
    if params.name == "lookup_order":
        order = ORDERS.get(int(args["order_id"]))
        data = (
            {"order_id": args["order_id"], **order} if order else {"status": "not_found", "order_id": args["order_id"]}
        )
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=json.dumps(data))], structured_content=data
        )
    if params.name == "inventory_report":
        sku = str(args["sku"])
        if sku == "BROKEN":
            text = "inventory service says: upstream timeout, try later"
        else:
            text = json.dumps({"sku": sku, "count": str(STOCK.get(sku, 0))})  # legacy: the count is a string
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])
    if params.name == "cancel_order":
        if int(args["order_id"]) in ORDERS and ORDERS[int(args["order_id"])]["status"] == "shipped":
            return types.CallToolResult(
                content=[types.TextContent(type="text", text="order already shipped")], is_error=True
            )
        return types.CallToolResult(content=[], structured_content={"cancelled": True})
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=f"unknown tool {params.name}")], is_error=True
    )


server = Server("orders", on_list_tools=list_tools, on_call_tool=call_tool)


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
