"""End-to-end runs through the real stack: one run at a time (baseline) vs many at once."""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import yaml

from loopwarden.client import Client
from loopwarden.stack import LocalStack
from shared.scenario import parse_scenario
from shared.settings import Settings

ROOT = Path(__file__).resolve().parents[1]


async def _runs(client: Client, n: int, concurrent: bool) -> list[float]:
    scenario = parse_scenario(yaml.safe_load((ROOT / "scenarios" / "demo.yaml").read_text()))

    async def one() -> float:
        start = time.perf_counter()
        run_id = await client.submit_scenario(scenario)
        state = await client.wait(run_id, timeout=120, history=False)  # the run, not reading it back
        assert state.status == "completed", state.final_reason
        return time.perf_counter() - start

    if concurrent:
        return list(await asyncio.gather(*(one() for _ in range(n))))
    return [await one() for _ in range(n)]


def run(n: int = 20) -> dict[str, float]:
    stack = LocalStack(
        state_dir=Path(tempfile.mkdtemp(prefix="lw-bench-")),
        services=("planner", "planner", "executor", "executor", "validator", "judge", "governor", "escalation"),
    )
    stack.start()
    try:

        async def main() -> dict[str, float]:
            async with Client(Settings(nats_url=stack.nats_url)) as client:
                await _runs(client, 2, concurrent=False)  # warm-up
                t0 = time.perf_counter()
                sequential = await _runs(client, n, concurrent=False)
                t1 = time.perf_counter()
                parallel = await _runs(client, n, concurrent=True)
                t2 = time.perf_counter()
            return {
                "runs": n,
                "seq_median_s": statistics.median(sequential),
                "seq_runs_per_s": n / (t1 - t0),
                "par_median_s": statistics.median(parallel),
                "par_runs_per_s": n / (t2 - t1),
            }

        return asyncio.run(main())
    finally:
        stack.stop()


def report(r: dict[str, float]) -> list[str]:
    return [
        f"demo scenario (3 model turns, 4 tool executions incl. one retried 503, 1 judge call), {r['runs']:.0f} runs:",
        f"  one at a time   median {r['seq_median_s'] * 1000:7.0f} ms   {r['seq_runs_per_s']:6.2f} runs/s   1.0x",
        f"  all at once     median {r['par_median_s'] * 1000:7.0f} ms   {r['par_runs_per_s']:6.2f} runs/s "
        f"{r['par_runs_per_s'] / r['seq_runs_per_s']:5.1f}x  (2 planner, 2 executor replicas)",
    ]
