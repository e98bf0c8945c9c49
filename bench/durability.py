"""What durability costs (issue 28, edge 7): the same agent steps through the real stack (one replica each)
with JetStream's default fsync (every 2 minutes) and with ``LW_NATS_SYNC_INTERVAL=always`` (an fsync on
every write before its ack), in one invocation, printed as a ratio.

Figures per level: one JetStream publish awaited for its PubAck (median), the per-step p50/p99 of
sequential runs, and steps/s with 16 runs at once. The store directory's filesystem is reported: on a
tmpfs an fsync costs nothing and the ratio says nothing.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path
from typing import Any

from bench.throughput import ENV, ONE_EACH, StepClock, pct, round_trip_ms, run_many, steps_scenario
from loopwarden.client import Client
from loopwarden.stack import LocalStack
from shared.settings import Settings

LEVELS = {"default (2 min)": None, "always": "always"}


def filesystem(path: Path) -> str:
    """The type of the filesystem ``path`` is on (the longest mount point above it in /proc/mounts)."""
    best, kind = "", "unknown"
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return kind
    target = str(path.resolve())
    for line in mounts:
        parts = line.split()
        if len(parts) >= 3 and (target == parts[1] or target.startswith(parts[1].rstrip("/") + "/")):
            if len(parts[1]) > len(best):
                best, kind = parts[1], parts[2]
    return kind


def measure(sync: str | None, runs: int, steps: int, concurrent: int, conc_steps: int) -> dict[str, Any]:
    state_dir = Path(tempfile.mkdtemp(prefix="lw-bench-sync-", dir=os.environ.get("LW_BENCH_DIR")))
    env = {**ENV, **({"LW_NATS_SYNC_INTERVAL": sync} if sync else {})}
    stack = LocalStack(state_dir=state_dir, env=env, services=ONE_EACH)
    stack.start()
    try:

        async def main() -> dict[str, Any]:
            async with Client(Settings(nats_url=stack.nats_url)) as client:
                await run_many(client, [steps_scenario(3) for _ in range(4)])  # warm-up
                clock = StepClock()
                await clock.start(client)
                r: dict[str, Any] = {"rt_ms": await round_trip_ms(client)}
                durations: list[float] = []
                for _ in range(runs):
                    _, ids = await run_many(client, [steps_scenario(steps)])
                    durations += clock.steps(ids[0])[1:]
                r["p50_ms"], r["p99_ms"] = pct(durations, 0.5) * 1000, pct(durations, 0.99) * 1000
                wall, _ = await run_many(client, [steps_scenario(conc_steps) for _ in range(concurrent)])
                r["steps_s"] = concurrent * conc_steps / wall
                return r

        result = asyncio.run(main())
    finally:
        stack.stop()
    result["fs"] = filesystem(state_dir)
    return result


def run(quick: bool = False) -> dict[str, Any]:
    runs, steps = (1, 12) if quick else (3, 40)
    concurrent, conc_steps = (4, 4) if quick else (16, 20)
    out: dict[str, Any] = {"quick": quick, "runs": runs, "steps": steps, "concurrent": concurrent}
    out["load_before"] = os.getloadavg()[0]
    out["levels"] = {name: measure(sync, runs, steps, concurrent, conc_steps) for name, sync in LEVELS.items()}
    out["load_after"] = os.getloadavg()[0]
    return out


def report(r: dict[str, Any]) -> list[str]:
    note = " (quick: fewer/shorter runs)" if r["quick"] else ""
    levels = r["levels"]
    base, always = levels["default (2 min)"], levels["always"]
    lines = [
        f"durability: agent steps with JetStream's fsync every 2 min (default) vs on every write "
        f"(LW_NATS_SYNC_INTERVAL=always){note}; one replica each; store on {always['fs']}; machine load "
        f"{r['load_before']:.1f} before, {r['load_after']:.1f} after",
        f"  {'sync_interval':16} {'PubAck p50':>11} {'step p50':>10} {'step p99':>10} "
        + f"steps/s at {r['concurrent']} runs".rjust(20),
    ]
    for name, m in levels.items():
        lines.append(
            f"  {name:16} {m['rt_ms']:8.2f} ms {m['p50_ms']:7.2f} ms {m['p99_ms']:7.2f} ms {m['steps_s']:20.0f}"
        )
    lines.append(
        f"  always / default: PubAck {always['rt_ms'] / base['rt_ms']:4.2f}x, step p50 "
        f"{always['p50_ms'] / base['p50_ms']:4.2f}x, step p99 {always['p99_ms'] / base['p99_ms']:4.2f}x, "
        f"steps/s {always['steps_s'] / base['steps_s']:4.2f}x"
        + ("   (tmpfs: an fsync is free here, the ratio means nothing)" if always["fs"] == "tmpfs" else "")
    )
    return lines
