"""What an MCP tool call costs over the tool's own time (issue 14).

* client: the lab server's ``profile`` tool (no work of its own) called in-process, through the
  SDK alone (``session.call_tool``: stdio JSON-RPC round trip) and through the executor's MCP
  caller (the same plus result shaping): the caller's own cost is the difference;
* loop: the same run through the whole stack (planner, executor, validator) with N calls to
  the MCP ``profile`` tool, and with N calls to the Python ``calculator`` tool: what an MCP call
  adds is the difference of the executor's own per-call times (``duration_ms`` of each result),
  and, noisier, of the whole runs divided by N.

``python -m bench.mcp [--quick]`` (also ``python -m bench --only mcp``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loopwarden.client import Client
from loopwarden.stack import LocalStack
from services.executor.mcp_tools import close_all, mount_mcp_servers
from services.executor.registry import ToolRegistry
from shared import subjects as S
from shared.scenario import parse_scenario
from shared.settings import McpServerSpec, Settings
from shared.tools import ToolContext

LAB = {"name": "lab", "command": [sys.executable, "-m", "services.executor.tools.mcp_lab"], "start_timeout_s": 120}


async def client_side(n: int) -> dict[str, float]:
    registry = ToolRegistry()
    (mount,) = await mount_mcp_servers(registry, [McpServerSpec.model_validate(LAB)])
    try:
        session = mount.session
        assert session is not None, mount.detail
        fn = registry.tools["profile"].fn
        ctx = ToolContext(run_id="bench", call_id="bench", attempt=1)
        for _ in range(10):  # warm-up
            await fn({}, ctx)
        sdk, ours = [], []
        for _ in range(n):
            t0 = time.perf_counter()
            await session.call_tool("profile", {})
            t1 = time.perf_counter()
            await fn({}, ctx)
            t2 = time.perf_counter()
            sdk.append(t1 - t0)
            ours.append(t2 - t1)
        return {"calls": n, "sdk_ms": statistics.median(sdk) * 1000, "ours_ms": statistics.median(ours) * 1000}
    finally:
        await close_all([mount])


def scenario(tool: str, args: dict[str, Any], calls: int) -> Any:
    turns: list[dict[str, Any]] = [{"tool_calls": [{"name": tool, "input": args}]} for _ in range(calls)]
    turns.append({"tool_calls": [{"name": "submit_result", "input": {"answer": "done"}}]})
    return parse_scenario(
        {"name": f"bench-{tool}", "task": "bench", "planner": turns, "limits": {"max_iterations": calls + 2}}
    )


def loop(calls: int, runs: int) -> dict[str, float]:
    stack = LocalStack(
        state_dir=Path(tempfile.mkdtemp(prefix="lw-bench-mcp-")),
        services=("planner", "executor", "validator", "judge", "governor", "escalation"),
        env={"LW_LOOP_REPEAT_THRESHOLD": "1000", "LW_LOOP_WINDOW": "2"},  # identical calls on purpose
        env_per_service={"executor": {"LW_MCP_SERVERS": json.dumps([LAB])}},
    )
    stack.start()
    try:

        async def main() -> dict[str, float]:
            async with Client(Settings(nats_url=stack.nats_url)) as client:
                executed: dict[str, list[float]] = {"profile": [], "calculator": []}

                async def on_raw(msg: Any) -> None:  # the executor's own timing of each call (attempts incl.)
                    raw = json.loads(msg.data)
                    executed.setdefault(raw["tool"], []).append(raw["duration_ms"])

                await client.bus.broker.connection.subscribe(S.RESULT_VALIDATE, cb=on_raw)

                async def timed(tool: str, args: dict[str, Any]) -> float:
                    t0 = time.perf_counter()
                    state = await client.wait(await client.submit_scenario(scenario(tool, args, calls)), timeout=300)
                    assert state.status == "completed", state.final_reason
                    return time.perf_counter() - t0

                mcp_runs, py_runs = [], []
                await timed("profile", {})  # warm-up
                await timed("calculator", {"expression": "1+1"})
                for _ in range(runs):  # interleaved, so load changes hit both alike
                    mcp_runs.append(await timed("profile", {}))
                    py_runs.append(await timed("calculator", {"expression": "1+1"}))
            mcp, py = statistics.median(mcp_runs), statistics.median(py_runs)
            return {
                "calls": calls,
                "runs": runs,
                "mcp_run_s": mcp,
                "py_run_s": py,
                "per_call_ms": (mcp - py) / calls * 1000,
                "mcp_exec_ms": statistics.median(executed["profile"]),
                "py_exec_ms": statistics.median(executed["calculator"]),
            }

        return asyncio.run(main())
    finally:
        stack.stop()


def report(c: dict[str, float], lp: dict[str, float] | None) -> list[str]:
    lines = [
        f"MCP tool call, in-process client, {c['calls']:.0f} calls of a tool with no work of its own (median):",
        f"  SDK alone (stdio JSON-RPC round trip)   {c['sdk_ms']:6.2f} ms",
        f"  executor's MCP caller                   {c['ours_ms']:6.2f} ms   "
        f"(+{c['ours_ms'] - c['sdk_ms']:.2f} ms shaping)",
    ]
    if lp is not None:
        lines += [
            f"through the loop, {lp['runs']:.0f} runs of {lp['calls']:.0f} sequential calls each (median run):",
            f"  Python tool (calculator)   {lp['py_run_s'] * 1000:7.0f} ms",
            f"  MCP tool (lab profile)     {lp['mcp_run_s'] * 1000:7.0f} ms",
            f"  whole run difference       {lp['per_call_ms']:7.1f} ms per call (noisy when the machine is loaded)",
            f"  inside the executor, per call (ledger writes + the call, median): Python {lp['py_exec_ms']:.1f} ms, "
            f"MCP {lp['mcp_exec_ms']:.1f} ms: an MCP call adds {lp['mcp_exec_ms'] - lp['py_exec_ms']:.1f} ms",
        ]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(prog="bench.mcp")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-loop", action="store_true", help="only the in-process client measurement")
    args = parser.parse_args()
    c = asyncio.run(client_side(50 if args.quick else 300))
    lp = None if args.no_loop else loop(calls=5 if args.quick else 10, runs=2 if args.quick else 5)
    print("\n".join(report(c, lp)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
