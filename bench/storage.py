"""What a run leaves behind: bytes per run in every stream and bucket, nats-server memory, and
(the soak) whether latency, storage or memory drift over thousands of runs.

One replica of each service, the demo scenario (3 model turns, 4 tool executions incl. a retried
503, 1 judge call), ``batch`` runs at a time. Storage is read from the server (``stream_info``:
bytes and messages of each stream, KV bucket ``KV_*`` and object store ``OBJ_*``); nats-server's
memory is its resident set from /proc. With ``sweep`` the retention sweeper runs between batches
with a zero retention, so the figures show what a finished run costs once its records expired.

``python -m bench --only storage`` (``--quick`` for the short form; ``LW_BENCH_SOAK_RUNS`` sets the
long form's run count, default 2000).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from loopwarden.client import Client
from loopwarden.stack import LocalStack
from shared.scenario import Scenario, parse_scenario
from shared.settings import Settings

ROOT = Path(__file__).resolve().parents[1]


def demo() -> Scenario:
    return parse_scenario(yaml.safe_load((ROOT / "scenarios" / "demo.yaml").read_text()))


async def storage(client: Client) -> dict[str, tuple[int, int]]:
    """Every stream's (bytes, messages), by stream name (KV buckets are ``KV_<bucket>``)."""
    out: dict[str, tuple[int, int]] = {}
    for info in await client.bus.js.streams_info():
        out[info.config.name or "?"] = (info.state.bytes, info.state.messages)
    return dict(sorted(out.items()))


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


@dataclass
class Batch:
    runs_done: int
    seconds: float
    median_run_s: float
    stored_bytes: int
    server_rss: int


@dataclass
class StorageResult:
    runs: int
    batch: int
    swept: bool
    per_run: dict[str, tuple[float, float]] = field(default_factory=dict)  # name -> (bytes, messages) per run
    batches: list[Batch] = field(default_factory=list)
    rss_start: int = 0
    rss_end: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    sweep_s: list[float] = field(default_factory=list)
    load: tuple[float, float] = (0.0, 0.0)  # machine load average before, after


def run(runs: int = 200, batch: int = 50, *, sweep: bool = False) -> StorageResult:
    env = {"LW_RETENTION_RUNS_S": "0", "LW_RETENTION_ESCALATIONS_S": "0"} if sweep else {}
    stack = LocalStack(
        state_dir=Path(tempfile.mkdtemp(prefix="lw-bench-storage-")),
        services=("planner", "executor", "validator", "judge", "governor", "escalation"),
        env=env,
    )
    stack.start()
    server_pid = next(p.popen.pid for p in stack.procs if p.name == "nats-server")
    result = StorageResult(runs=runs, batch=batch, swept=sweep)
    load_before = os.getloadavg()[0]
    try:

        async def main() -> None:
            settings = Settings(nats_url=stack.nats_url, **({"retention_runs_s": 0.0} if sweep else {}))
            async with Client(settings) as client:
                scenario = demo()

                async def one() -> float:
                    start = time.perf_counter()
                    run_id = await client.submit_scenario(scenario)
                    state = await client.wait(run_id, timeout=300)
                    result.statuses[state.status] = result.statuses.get(state.status, 0) + 1
                    return time.perf_counter() - start

                await asyncio.gather(*(one() for _ in range(4)))  # warm-up: streams, buckets, contracts
                result.statuses.clear()
                if sweep:
                    await _sweep(client, settings)
                before = await storage(client)
                result.rss_start = rss_bytes(server_pid)
                done = 0
                while done < runs:
                    n = min(batch, runs - done)
                    t0 = time.perf_counter()
                    times = await asyncio.gather(*(one() for _ in range(n)))
                    seconds = time.perf_counter() - t0
                    done += n
                    if sweep:
                        s0 = time.perf_counter()
                        await _sweep(client, settings)
                        result.sweep_s.append(time.perf_counter() - s0)
                    now = await storage(client)
                    result.batches.append(
                        Batch(
                            done,
                            seconds,
                            statistics.median(times),
                            sum(b for b, _ in now.values()),
                            rss_bytes(server_pid),
                        )
                    )
                after = await storage(client)
                result.rss_end = rss_bytes(server_pid)
                for name in sorted(set(before) | set(after)):
                    b0, m0 = before.get(name, (0, 0))
                    b1, m1 = after.get(name, (0, 0))
                    result.per_run[name] = ((b1 - b0) / runs, (m1 - m0) / runs)

        asyncio.run(main())
    finally:
        stack.stop()
    result.load = (load_before, os.getloadavg()[0])
    return result


async def _sweep(client: Client, settings: Settings) -> None:
    from loopwarden.records import sweep

    await sweep(client.bus, settings)


def report(r: StorageResult) -> list[str]:
    mode = "records swept after each batch (retention 0 s)" if r.swept else "nothing expired"
    total = sum(b for b, _ in r.per_run.values())
    lines = [
        f"storage per run: {r.runs} demo runs, {r.batch} at a time, one replica each, {mode}; "
        f"outcomes {dict(sorted(r.statuses.items()))}",
        f"  {'stream / bucket':24} {'bytes/run':>10} {'msgs/run':>9}",
    ]
    for name, (b, m) in sorted(r.per_run.items(), key=lambda kv: -kv[1][0]):
        if abs(b) >= 1 or abs(m) >= 0.01:
            lines.append(f"  {name:24} {b:10.0f} {m:9.2f}")
    lines.append(f"  {'total':24} {total:10.0f}   = {total * 1000 / 1e6:.1f} MB per 1,000 runs")
    growth = r.rss_end - r.rss_start
    lines.append(
        f"  nats-server RSS {r.rss_start / 1e6:.0f} MB -> {r.rss_end / 1e6:.0f} MB over {r.runs} runs = "
        f"{growth * 1000 / max(1, r.runs) / 1e6:+.1f} MB per 1,000 runs"
    )
    if len(r.batches) >= 4:  # past the warm-up (caches, buffers): the slope from the first quarter to the end
        q = r.batches[len(r.batches) // 4 - 1]
        slope = (r.batches[-1].server_rss - q.server_rss) / max(1, r.batches[-1].runs_done - q.runs_done)
        lines.append(
            f"    from run {q.runs_done} to run {r.batches[-1].runs_done}: {q.server_rss / 1e6:.0f} -> "
            f"{r.batches[-1].server_rss / 1e6:.0f} MB = {slope * 1000 / 1e6:+.1f} MB per 1,000 runs"
        )
    if r.batches:
        first, last = r.batches[0], r.batches[-1]
        lines.append(
            f"  batch of {r.batch}: first {first.seconds:.2f} s (median run {first.median_run_s * 1000:.0f} ms), "
            f"last {last.seconds:.2f} s (median run {last.median_run_s * 1000:.0f} ms) = "
            f"{last.seconds / first.seconds:.2f}x; stored {first.stored_bytes / 1e6:.1f} MB after {first.runs_done} "
            f"runs, {last.stored_bytes / 1e6:.1f} MB after {last.runs_done}; machine load {r.load[0]:.1f} -> "
            f"{r.load[1]:.1f}"
        )
        quarter = max(1, len(r.batches) // 4)
        head = statistics.median(b.seconds for b in r.batches[:quarter])
        tail = statistics.median(b.seconds for b in r.batches[-quarter:])
        lines.append(f"  median batch, first quarter {head:.2f} s, last quarter {tail:.2f} s = {tail / head:.2f}x")
    if r.sweep_s:
        lines.append(
            f"  retention sweep after each batch: median {statistics.median(r.sweep_s):.2f} s, "
            f"max {max(r.sweep_s):.2f} s ({r.batch} runs purged each)"
        )
    return lines


def soak_runs() -> int:
    return int(os.environ.get("LW_BENCH_SOAK_RUNS", "2000"))
