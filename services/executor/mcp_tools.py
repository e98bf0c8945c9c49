"""Tools mounted from MCP servers (stdio transport).

Each server's tools become ordinary contracts: their ``inputSchema``/``outputSchema`` pass
the same registration checks as any other tool (a tool without an ``outputSchema`` needs
one in the mount config — no contract, no registration), their ``structuredContent`` (or,
without it, their text content parsed as JSON) goes through the same output validation,
repairs and self-correction. ``idempotentHint``/``readOnlyHint`` annotations decide
idempotency. An MCP ``isError`` result is a fatal tool failure: the server says the call
failed and nothing says a retry would help.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from services.executor.registry import ToolContext, ToolFailure, ToolFn, ToolRegistry
from shared.messages import RepairRule, RetryPolicy, ToolContract
from shared.settings import McpServerSpec

log = logging.getLogger("loopwarden.executor.mcp")


class McpMount:
    """One live MCP server session, kept open for the executor's lifetime."""

    def __init__(self, spec: McpServerSpec) -> None:
        self.spec = spec
        self.session: ClientSession | None = None
        self._stack = contextlib.AsyncExitStack()

    async def start(self) -> list[tuple[ToolContract, ToolFn] | tuple[str, str]]:
        """Open the session; return (contract, fn) per tool, or (name, reason) for a refused one."""
        spec = self.spec
        params = StdioServerParameters(
            command=spec.command[0], args=spec.command[1:], env=spec.env or None, cwd=spec.cwd
        )
        read, write = (await self._stack.enter_async_context(stdio_client(params)))[:2]
        self.session = await self._stack.enter_async_context(ClientSession(read, write))
        await self.session.initialize()
        listed = await self.session.list_tools()
        found: list[tuple[ToolContract, ToolFn] | tuple[str, str]] = []
        for tool in listed.tools:
            if spec.tools is not None and tool.name not in spec.tools:
                continue
            name = f"{spec.prefix}{tool.name}"
            output_schema = tool.output_schema or spec.output_schemas.get(tool.name)
            if output_schema is None:
                found.append(
                    (
                        name,
                        f"MCP tool '{tool.name}' from server '{spec.name}' declares no outputSchema; "
                        f"add one under output_schemas in LW_MCP_SERVERS",
                    )
                )
                continue
            hints = tool.annotations
            idempotent = bool(hints and (hints.idempotent_hint or hints.read_only_hint))
            contract = ToolContract.model_validate(
                {
                    "name": name,
                    "description": tool.description or tool.title or f"{tool.name} (MCP server {spec.name})",
                    "inputSchema": dict(tool.input_schema),
                    "outputSchema": dict(output_schema),
                    "idempotent": idempotent,
                    "timeout_s": spec.timeout_s,
                    "retry": RetryPolicy(max_attempts=3 if idempotent else 1),
                    "repairs": [RepairRule.model_validate(r) for r in spec.repairs.get(tool.name, [])],
                    "source": "mcp",
                }
            )
            found.append((contract, self._caller(tool.name)))
        return found

    def _caller(self, remote_name: str) -> ToolFn:
        async def call(args: dict[str, Any], ctx: ToolContext) -> Any:
            if self.session is None:
                raise ToolFailure("transient", f"the MCP server '{self.spec.name}' is not connected")
            result = await self.session.call_tool(remote_name, args)
            text = "".join(getattr(c, "text", "") for c in result.content or [])
            if result.is_error:
                raise ToolFailure("fatal", f"the MCP tool '{remote_name}' reported an error: {text[:500]}")
            if result.structured_content is not None:
                return result.structured_content
            return text  # validated as JSON text by the validator (parse success is measured)

        return call

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._stack.aclose()


async def mount_mcp_servers(registry: ToolRegistry, specs: list[McpServerSpec]) -> list[McpMount]:
    """Mount every server; a server that fails to start is logged and its tools are absent."""
    mounts = []
    for spec in specs:
        mount = McpMount(spec)
        try:
            found = await mount.start()
        except Exception as err:
            registry.refused[f"mcp:{spec.name}"] = f"MCP server '{spec.name}' did not start: {err!r}"
            log.error("%s", registry.refused[f"mcp:{spec.name}"])
            await mount.close()
            continue
        for item in found:
            if isinstance(item[0], ToolContract):
                contract, fn = item
                registry.register(contract, fn)
            else:
                name, reason = item
                registry.refused[str(name)] = str(reason)
                log.error("refused MCP tool: %s", reason)
        mounts.append(mount)
    return mounts
