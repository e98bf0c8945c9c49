"""Tools mounted from MCP servers (stdio transport), as users mount them.

What a mounted tool's contract is, how its result reaches the model and which failure type each
protocol error is: ``mcp_contracts`` (pure). This module mounts and supervises the servers.

Lifecycle. Servers start concurrently, each bounded by its ``start_timeout_s``; each runs under
a supervisor task that reports its state (``starting``, ``up``, ``failed``, ``down``,
``stopped``) as an event on ``evt.mcp.server.<name>`` and in the ``lw_mcp_servers`` bucket,
and restarts a server that failed or died with exponential backoff. On Linux every server
is started with ``PR_SET_PDEATHSIG``, so no server outlives its executor even when the
executor is killed with SIGKILL; a clean stop closes the server's stdin and then kills its
process group (the SDK's shutdown).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import mcp_types as types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

from services.executor.mcp_contracts import (
    SchemaSource,
    classify_protocol_error,
    contract_for,
    guarded_command,
    output_of,
    render_content,
    side_effect_message,
)
from services.executor.registry import ToolRegistry
from shared.contracts.output import check_output
from shared.contracts.validation import format_for_model
from shared.messages import McpServerStatus, ToolContract
from shared.settings import McpServerSpec
from shared.tools import ToolContext, ToolFailure, ToolFn

log = logging.getLogger("loopwarden.executor.mcp")

StatusFn = Callable[[McpServerStatus], Awaitable[None]]
MountedFn = Callable[["McpMount"], Awaitable[None]]  # a server that failed at start came up later

# --- one server ------------------------------------------------------------------------------------


class _Session(ClientSession):
    async def validate_tool_result(self, name: str, result: types.CallToolResult) -> None:
        """Off: the validator checks ``structuredContent`` (open or closed as configured, with repairs);
        the SDK's check would turn a contract failure into an exception after the side effect."""


class McpMount:
    """One MCP server: a supervisor task owns its process and session, restarting it when it dies."""

    def __init__(
        self, spec: McpServerSpec, on_status: StatusFn | None = None, on_late_up: MountedFn | None = None
    ) -> None:
        self.spec = spec
        self.on_status = on_status
        self.on_late_up = on_late_up
        self.session: ClientSession | None = None
        self.tools: dict[str, tuple[types.Tool, ToolContract, SchemaSource]] = {}  # mounted name -> ...
        self.refused: dict[str, str] = {}
        self.state = "starting"
        self.detail = ""
        self.restarts = 0
        self.next_start_at: float | None = None
        self._stop = asyncio.Event()
        self._first: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self._task: asyncio.Task[None] | None = None
        self.hosting = False  # its tools are registered (it came up at the executor's start)
        self.executor_id = f"{socket.gethostname()}:{os.getpid()}"

    # lifecycle ----------------------------------------------------------------------------
    async def start(self) -> str | None:
        """Start the supervisor; return once the first start succeeded (None) or failed (the reason)."""
        self._task = asyncio.create_task(self._supervise(), name=f"mcp-server-{self.spec.name}")
        return await asyncio.shield(self._first)

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                async with asyncio.timeout(8):
                    await asyncio.shield(self._task)
            if not self._task.done():
                self._task.cancel()

    async def _supervise(self) -> None:
        failures = 0
        while not self._stop.is_set():
            was_up, reason = await self._run_once()
            if self._stop.is_set():
                break
            failures = 0 if was_up else failures + 1
            delay = min(self.spec.restart_max_s, self.spec.restart_base_s * 2 ** max(0, failures - 1))
            self.next_start_at = time.monotonic() + delay
            await self._report("down" if was_up else "failed", reason, next_start_in_s=round(delay, 3))
            if not self._first.done():
                self._first.set_result(reason)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._stop.wait()
            if not self._stop.is_set():
                self.restarts += 1
        self.next_start_at = None
        if not self._first.done():
            self._first.set_result("stopped before it started")
        await self._report("stopped", "the executor is stopping")

    async def _run_once(self) -> tuple[bool, str]:
        """Run the server until it dies or we stop: (whether it came up, why it ended)."""
        spec = self.spec
        await self._report("starting", f"attempt {self.restarts + 1}")
        started = time.monotonic()
        command = guarded_command(spec.command)
        params = StdioServerParameters(command=command[0], args=command[1:], env=spec.env or None, cwd=spec.cwd)
        dead = asyncio.Event()
        was_up = False
        try:
            async with contextlib.AsyncExitStack() as stack:  # entered and left in this task (anyio scopes)
                read, write = (await stack.enter_async_context(stdio_client(params)))[:2]
                relay_send, relay_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)

                async def relay() -> None:  # the server's messages to the session; its end is the server's death
                    try:
                        async with relay_send:
                            async for item in read:
                                await relay_send.send(item)
                    except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
                        pass
                    finally:
                        dead.set()

                relay_task = asyncio.create_task(relay())
                stack.callback(relay_task.cancel)
                session = await stack.enter_async_context(_Session(relay_recv, write))
                try:
                    with anyio.fail_after(spec.start_timeout_s):
                        await session.initialize()
                        listed = await self._list_tools(session)
                except TimeoutError:
                    reason = f"no handshake and tool list within {spec.start_timeout_s:g}s (start_timeout_s)"
                    if not self._first.done():
                        self._first.set_result(reason)  # the executor need not wait for the teardown
                    return False, reason
                self._absorb(listed)
                self.session, was_up = session, True
                ms = round((time.monotonic() - started) * 1000, 1)
                if not self.hosting and self._first.done() and self.on_late_up is not None:
                    await self.on_late_up(self)  # failed at the executor's start: host its tools now
                await self._report("up", f"{len(self.tools)} tool(s) mounted", start_ms=ms)
                if not self._first.done():
                    self._first.set_result(None)
                stopping = asyncio.create_task(self._stop.wait())
                dying = asyncio.create_task(dead.wait())
                try:
                    await asyncio.wait({stopping, dying}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    stopping.cancel()
                    dying.cancel()
                    self.session = None
                return True, "the server process exited" if dead.is_set() else "stopped"
        except Exception as err:
            self.session = None
            if was_up:
                return True, f"the session ended: {err!r}"
            return False, f"did not start: {err!r}"

    async def _list_tools(self, session: ClientSession) -> list[types.Tool]:
        tools: list[types.Tool] = []
        cursor: str | None = None
        while True:
            page = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                return tools

    def _absorb(self, listed: list[types.Tool]) -> None:
        """Contracts for the listed tools (first start); on a restart, the first contracts stay in force."""
        if self.tools or self.refused:
            gone = sorted(n for n, (t, _, _) in self.tools.items() if t.name not in {x.name for x in listed})
            if gone:
                log.error("MCP server '%s' restarted without tool(s) %s", self.spec.name, ", ".join(gone))
            return
        for tool in listed:
            if self.spec.tools is not None and tool.name not in self.spec.tools:
                continue
            made = contract_for(self.spec, tool)
            if isinstance(made, str):
                self.refused[f"{self.spec.prefix}{tool.name}"] = made
            else:
                self.tools[made[0].name] = (tool, made[0], made[1])

    async def _report(self, state: str, detail: str, **extra: Any) -> None:
        self.state, self.detail = state, detail
        level = logging.INFO if state in ("starting", "up", "stopped") else logging.ERROR
        log.log(level, "MCP server '%s' %s: %s", self.spec.name, state, detail)
        if self.on_status is None:
            return
        status = McpServerStatus.model_validate(
            {
                "server": self.spec.name,
                "executor": self.executor_id,
                "state": state,
                "detail": detail,
                "tools": sorted(self.tools),
                "refused": self.refused,
                "restarts": self.restarts,
                **extra,
            }
        )
        try:
            await self.on_status(status)
        except Exception as err:  # a status that cannot be published must not stop the supervisor
            log.warning("MCP server '%s': status not published: %r", self.spec.name, err)

    # calls --------------------------------------------------------------------------------------
    def caller(self, name: str, registry: ToolRegistry) -> ToolFn:
        tool, declared, source = self.tools[name]
        spec, remote, idempotent = self.spec, tool.name, declared.idempotent

        async def call(args: dict[str, Any], ctx: ToolContext) -> Any:
            session = self.session
            if session is None:  # not sent: safe to report as transient whatever the tool does
                wait = max(0.0, (self.next_start_at or time.monotonic()) - time.monotonic())
                raise ToolFailure(
                    "transient",
                    f"the MCP server '{spec.name}' is not running ({self.state}: {self.detail}); it is being restarted",
                    retry_after_s=round(wait, 3) or None,
                )
            try:
                result = await session.call_tool(remote, args, read_timeout_seconds=spec.timeout_s)
            except MCPError as err:
                kind, detail, effect = classify_protocol_error(err, idempotent)
                raise ToolFailure(kind, detail, effect=effect) from err
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream) as err:
                raise ToolFailure(
                    "transient" if idempotent else "unknown_outcome",
                    f"the MCP server '{spec.name}' stopped during the call",
                    effect=None if idempotent else "may_have",
                ) from err
            if result.is_error:
                text = render_content(result.content or [], spec.max_result_chars) or "(no message)"
                caution = (
                    ""
                    if idempotent
                    else " It may have done part of its work: check the current state before calling it again."
                )
                raise ToolFailure(
                    "tool_error",
                    f"'{name}' reported an error: {text}\nRead it, fix the arguments if they caused it, "
                    f"or take another approach.{caution}",
                    effect=None if idempotent else "may_have",
                )
            output = output_of(source, result, spec.max_result_chars)
            if not idempotent:
                self._refuse_after_effect(name, registry, output, result)
            return output

        return call

    def _refuse_after_effect(
        self, name: str, registry: ToolRegistry, output: Any, result: types.CallToolResult
    ) -> None:
        """A non-idempotent call already acted: a result that breaks its contract must not read as
        'make a new call'. Checked here with the validator's own check (repairs included)."""
        hosted = registry.tools.get(name)
        if hosted is None:
            return
        checked = check_output(hosted.contract, output, is_text=isinstance(output, str))
        if checked.ok:
            return
        returned = render_content(result.content or [], 2000)
        if result.structured_content is not None:
            returned = json.dumps(result.structured_content, ensure_ascii=False)[:2000]
        raise ToolFailure(
            "tool_error",
            side_effect_message(name, format_for_model(checked.errors), returned or "(nothing)"),
            effect="took_effect",
        )


# --- every server ----------------------------------------------------------------------------------


async def mount_mcp_servers(
    registry: ToolRegistry,
    specs: list[McpServerSpec],
    on_status: StatusFn | None = None,
    on_late_up: MountedFn | None = None,
) -> list[McpMount]:
    """Start every server concurrently (each bounded by its start-up timeout) and register the tools
    of those that came up. A server that did not start is refused as ``mcp:<name>``, reported, and
    kept restarting in the background; when it comes up, ``on_late_up`` hosts its tools."""
    mounts = [McpMount(spec, on_status, on_late_up) for spec in specs]
    reasons = await asyncio.gather(*(m.start() for m in mounts))
    for mount, reason in zip(mounts, reasons, strict=True):
        if reason is not None:
            registry.refused[f"mcp:{mount.spec.name}"] = f"MCP server '{mount.spec.name}' did not start: {reason}"
            continue
        host(mount, registry)
    return mounts


def host(mount: McpMount, registry: ToolRegistry) -> list[str]:
    """Register the tools of a server that is up; returns the names now registered."""
    registry.refused.pop(f"mcp:{mount.spec.name}", None)
    for name, reason_refused in mount.refused.items():
        registry.refused[name] = reason_refused
        log.error("refused MCP tool: %s", reason_refused)
    added = []
    for name, (tool, contract, _) in mount.tools.items():
        if name in registry.tools:  # two servers with one tool name: never let one shadow the other
            registry.refused[f"{mount.spec.name}/{tool.name}"] = (
                f"MCP tool '{tool.name}' from server '{mount.spec.name}': the name '{name}' is already "
                "registered; give this server a prefix in LW_MCP_SERVERS"
            )
            continue
        registry.register(contract, mount.caller(name, registry))
        added.append(name)
    mount.hosting = True
    return added


async def close_all(mounts: list[McpMount]) -> None:
    await asyncio.gather(*(m.close() for m in mounts), return_exceptions=True)


# --- for the CLI (loopwarden lint / check-contract) ---------------------------------------------------

SOURCE_NOTES: dict[SchemaSource, str] = {
    "server": "the server's outputSchema",
    "user": "output_schemas in LW_MCP_SERVERS (structuredContent, else its text parsed as JSON)",
    "content": "none declared: its content reaches the model as text",
}


def describe(mount: McpMount) -> list[str]:
    """One line per mounted tool: where its output contract comes from, and its idempotency."""
    spec = mount.spec
    lines = []
    for name, (tool, contract, source) in sorted(mount.tools.items()):
        note = SOURCE_NOTES[source]
        if source == "server":
            note += " (closed: closed_output_schemas)" if spec.closed_output_schemas else " (kept open)"
        effect = "idempotent" if contract.idempotent else "not idempotent: never retried, a failure may have acted"
        lines.append(f"mcp     {spec.name}/{tool.name} -> {name}: output {note}; {effect}")
    return lines


async def inspect_servers(registry: ToolRegistry, specs: list[McpServerSpec]) -> list[str]:
    """Start every server as the executor would, register its tools, describe them, stop the servers."""
    mounts = await mount_mcp_servers(registry, specs)
    try:
        return [line for m in mounts for line in describe(m)]
    finally:
        await close_all(mounts)


async def probe(
    registry: ToolRegistry, spec: McpServerSpec, tool: str, args: dict[str, Any] | None
) -> tuple[list[str], Any]:
    """``check-contract mcp:<server>/<tool>``: mount one server as the executor would, describe the tool
    and, given ``args``, call it once: (lines, the output the validator would check, or the
    ``ToolFailure`` the executor would report, or None when not called)."""
    mounts = await mount_mcp_servers(registry, [spec])
    try:
        lines = [line for m in mounts for line in describe(m) if line.split(" -> ")[0].endswith(f"/{tool}")]
        hosted = registry.tools.get(f"{spec.prefix}{tool}")
        if args is None or hosted is None:
            return lines, None
        try:
            return lines, await hosted.fn(args, ToolContext(run_id="cli", call_id="cli", attempt=1))
        except ToolFailure as failure:
            return lines, failure
    finally:
        await close_all(mounts)
