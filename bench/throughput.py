"""Throughput and the cost of one agent step through the real stack, all in one invocation.

A *step* is one model turn that calls one tool, the tool's execution, its validation and the
outcome applied to the run (instant scripted model and tools unless a latency is given).
Figures (issue 8):

- per-step p50/p99 of the service loop (one replica each) and of the same domain code driven
  in one process without the bus (the floor), and their ratio;
- steps/s at 1, 16 and 64 concurrent runs, one replica each and two planner + two executor;
- latency-bound: 64 runs x 5 steps at 1 s model / 0.5 s tool latency vs one such run alone;
- per-step time at step 10 and at step 80 of one long run;
- CPU seconds per step summed over every service process and nats-server (from /proc).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loopwarden.client import Client
from loopwarden.stack import LocalStack
from shared import subjects as S
from shared.bus import RUN_ID_HEADER
from shared.scenario import Scenario, parse_scenario
from shared.settings import Settings

ONE_EACH = ("planner", "executor", "validator", "judge", "governor", "escalation")
TWO_TWO = ("planner", "planner", "executor", "executor", "validator", "judge", "governor", "escalation")
ENV = {"LW_LOG_LEVEL": "WARNING"}
TICK = os.sysconf("SC_CLK_TCK")

# Targets on the 2-core machine (issue 8) and the figures measured before this work.
BEFORE = {"p50_ms": 15.0, "steps_s_64": 90.0, "cpu_ms": 17.4, "step80_ratio": 20.9 / 15.7}


def steps_scenario(steps: int, model_s: float = 0.0, tool_s: float = 0.0) -> Scenario:
    seed = uuid.uuid4().int % 10_000
    planner: list[dict[str, Any]] = [
        {"latency_s": model_s, "tool_calls": [{"name": "calculator", "input": {"expression": f"{k}+{seed}"}}]}
        for k in range(steps)
    ]
    planner.append({"latency_s": model_s, "text": "done"})
    spec: dict[str, Any] = {
        "name": f"steps-{steps}",
        "task": "Add the numbers one by one, then say done.",
        "planner": planner,
        "answer_mode": "text",
        "limits": {"max_iterations": steps + 5, "cost_ceiling_usd": 10_000, "run_token_budget": 50_000_000},
    }
    if tool_s:
        spec["tools"] = {"calculator": [{"latency_s": tool_s, "times": "always"}]}
    return parse_scenario(spec)


def cpu_s(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime + stime
    return total / TICK


def sched_cpu_s(pid: int) -> float:
    """CPU seconds of one process to the nanosecond: field 1 of ``/proc/PID/task/TID/schedstat`` (ns on
    a CPU) summed over its threads (``/proc/PID/schedstat`` alone is the main thread's: nats-server
    runs on its other threads). ``/proc/PID/stat`` counts 10 ms ticks: a 20-step window of a 2 ms
    step is 4 ticks, too coarse to compare two windows."""
    total = 0
    for path in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total / 1e9


def write_calls(pid: int) -> int:
    """Write system calls the process made (``syscw`` of ``/proc/PID/io``, all its threads). On this machine a
    write to a loopback socket costs the writer the receiving side's TCP work too: what a step costs is mostly
    how many of them it takes, in every process (``docs/benchmarks.md``)."""
    try:
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            if line.startswith("syscw:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


@dataclass
class StepClock:
    """When each run's model turns were announced (``run.model_called``), as they arrive, and the
    size of every write of each run's record in ``lw_runs`` (the bucket's subject, as stored)."""

    marks: dict[str, list[float]] = field(default_factory=dict)
    record_bytes: dict[str, list[int]] = field(default_factory=dict)
    cpu_pids: dict[str, int] = field(default_factory=dict)  # when set: CPU seconds per process at each mark (ns clock)
    cpu_marks: dict[str, list[dict[str, float]]] = field(default_factory=dict)

    async def start(self, client: Client) -> None:
        async def on_msg(msg: Any) -> None:
            rid = (msg.headers or {}).get(RUN_ID_HEADER, "")
            self.marks.setdefault(rid, []).append(time.perf_counter())
            if self.cpu_pids:
                self.cpu_marks.setdefault(rid, []).append({k: sched_cpu_s(pid) for k, pid in self.cpu_pids.items()})

        async def on_record(msg: Any) -> None:
            self.record_bytes.setdefault(msg.subject.rsplit(".", 1)[-1], []).append(len(msg.data))

        await client.bus.nc.subscribe(S.any_run(S.run_event("model_called")), cb=on_msg)
        await client.bus.nc.subscribe(f"$KV.{S.KV_RUNS}.*", cb=on_record)

    def steps(self, run_id: str) -> list[float]:
        """Durations of the run's steps (between consecutive model turns), in seconds."""
        m = self.marks.get(run_id, [])
        return [b - a for a, b in itertools.pairwise(m)]


async def run_many(client: Client, scenarios: list[Scenario], timeout: float = 300) -> tuple[float, list[str]]:
    t0 = time.perf_counter()
    ids = await asyncio.gather(*(client.submit_scenario(sc) for sc in scenarios))
    states = await asyncio.gather(*(client.wait(rid, timeout=timeout, history=False) for rid in ids))
    wall = time.perf_counter() - t0
    bad = [s.final_reason for s in states if s.status != "completed"]
    if bad:
        raise RuntimeError(f"{len(bad)} run(s) did not complete: {bad[:3]}")
    return wall, list(ids)


async def round_trip_ms(client: Client, n: int = 200) -> float:
    """The machine's unit of cost right now: one JetStream publish awaited for its PubAck (median),
    measured in the same invocation as the figures it scales."""
    durations = []
    for k in range(n):
        t0 = time.perf_counter()
        await client.bus.js.publish(f"{S.P}.evt.bench.roundtrip._", b"{}", headers={"Nats-Msg-Id": f"rt-{k}-{t0}"})
        durations.append(time.perf_counter() - t0)
    return statistics.median(durations) * 1000


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def with_stack(services: tuple[str, ...], body: Callable[[LocalStack, Client], Any]) -> Any:
    stack = LocalStack(state_dir=Path(tempfile.mkdtemp(prefix="lw-bench-")), env=ENV, services=services)
    stack.start()
    try:

        async def main() -> Any:
            async with Client(Settings(nats_url=stack.nats_url)) as client:
                await run_many(client, [steps_scenario(3) for _ in range(4)])  # warm-up
                return await body(stack, client)

        return asyncio.run(main())
    finally:
        stack.stop()


def run(quick: bool = False) -> dict[str, Any]:
    seq_runs, seq_steps = (1, 12) if quick else (5, 40)
    long_runs = 1 if quick else 3  # a single run's step 80 / step 10 swings by a quarter on this machine
    long_steps = 30 if quick else 80
    conc_steps = 4 if quick else 20
    levels = (1, 4, 16) if quick else (1, 16, 64)
    lat_runs = 8 if quick else 64
    r: dict[str, Any] = {"quick": quick, "levels": levels, "lat_runs": lat_runs, "long_steps": long_steps}
    r["seq_steps"] = seq_steps

    async def one_each(stack: LocalStack, client: Client) -> None:
        pids = [p.popen.pid for p in stack.procs]
        clock = StepClock()
        await clock.start(client)
        r["rt_ms"] = await round_trip_ms(client)
        steps: list[float] = []
        r["loop_run_p50s"] = []
        for _ in range(seq_runs):
            _, ids = await run_many(client, [steps_scenario(seq_steps)])
            steps += clock.steps(ids[0])[1:]
            r["loop_run_p50s"].append(pct(clock.steps(ids[0])[1:], 0.5) * 1000)
        r["loop_p50_ms"], r["loop_p99_ms"] = pct(steps, 0.5) * 1000, pct(steps, 0.99) * 1000
        runs = []
        for _ in range(long_runs):  # each step's time: the median over the long runs
            _, ids = await run_many(client, [steps_scenario(long_steps)])
            runs.append(clock.steps(ids[0]))
        long = [statistics.median(at) for at in zip(*runs, strict=False)]
        r["long_runs"] = long_runs
        r["step10_ms"] = statistics.mean(long[5:15]) * 1000
        r["stepN_ms"] = statistics.mean(long[-10:]) * 1000
        sizes = clock.record_bytes.get(ids[0], [])  # two writes per step
        r["record10_b"], r["recordN_b"] = max(sizes[18:22] or [0]), max(sizes[-4:] or [0])
        # CPU per step early and late in one long run: each process's schedstat (ns) at each of its model turns
        clock.cpu_pids = {p.name: p.popen.pid for p in stack.procs}
        _, ids = await run_many(client, [steps_scenario(long_steps)])
        clock.cpu_pids = {}
        marks = clock.cpu_marks.get(ids[0], [])
        span = max(2, len(marks) // 4)

        def per_step(a: int, b: int, names: list[str]) -> float:
            return sum(marks[b][n] - marks[a][n] for n in names) / (b - a) * 1000

        everyone = list(marks[0]) if marks else []
        if len(marks) > 3 * span:
            r["cpu_early_ms"], r["cpu_late_ms"] = per_step(1, 1 + span, everyone), per_step(-1 - span, -1, everyone)
            r["planner_early_ms"] = per_step(1, 1 + span, ["planner"])
            r["planner_late_ms"] = per_step(-1 - span, -1, ["planner"])
            r["cpu_span"] = span
        for k in levels:
            c0 = cpu_s(pids)
            wall, _ = await run_many(client, [steps_scenario(conc_steps) for _ in range(k)])
            r[f"one_{k}"] = k * conc_steps / wall
            r[f"cpu_ms_{k}"] = (cpu_s(pids) - c0) / (k * conc_steps) * 1000
        single, _ = await run_many(client, [steps_scenario(5, model_s=1.0, tool_s=0.5)])
        some, _ = await run_many(client, [steps_scenario(5, model_s=1.0, tool_s=0.5) for _ in range(lat_runs // 4)])
        c0 = cpu_s(pids)
        many, _ = await run_many(client, [steps_scenario(5, model_s=1.0, tool_s=0.5) for _ in range(lat_runs)])
        r["lat_single_s"], r["lat_some_s"], r["lat_many_s"] = single, some, many
        r["lat_cpu_s"] = cpu_s(pids) - c0

    async def two_two(stack: LocalStack, client: Client) -> None:
        for k in levels:
            wall, _ = await run_many(client, [steps_scenario(conc_steps) for _ in range(k)])
            r[f"two_{k}"] = k * conc_steps / wall

    r["load_before"] = os.getloadavg()[0]
    with_stack(ONE_EACH, one_each)
    with_stack(TWO_TWO, two_two)
    r["load_after"] = os.getloadavg()[0]
    floor = asyncio.run(floor_steps(seq_runs, seq_steps))
    r["floor_p50_ms"], r["floor_p99_ms"] = pct(floor, 0.5) * 1000, pct(floor, 0.99) * 1000
    return r


async def floor_steps(runs: int, steps: int) -> list[float]:
    """The same step's domain code in one process, no bus: context and token counts, the budget
    decision, the scripted model, the state machine, the tool, output validation."""
    from services.executor.app import load_registry
    from services.executor.handlers import raw_result
    from services.governor.budget import BudgetLedger, evaluate
    from services.planner import context as C
    from services.planner.outcomes import apply_outcome
    from services.planner.turns import apply_model_response, resolve_config, start_run
    from services.validator.checking import outcome_of
    from shared.messages import RunLimits, RunSubmit, ToolCall
    from shared.providers.scripted import ScriptedProvider
    from shared.tools import ToolContext

    settings = Settings()
    registry = load_registry(settings)
    contracts = {name: h.contract for name, h in registry.hosted(None).items()}
    durations: list[float] = []
    for _ in range(runs):
        scenario = steps_scenario(steps)
        run_id = f"run-floor{uuid.uuid4().hex[:12]}"
        limits = scenario.limits or RunLimits()
        submit = RunSubmit(run_id=run_id, task=scenario.task, limits=limits, answer_mode="text")
        state = start_run(submit, resolve_config(submit, settings, contracts), []).state
        provider, ledger = ScriptedProvider(scenario), BudgetLedger(run_id=run_id)
        first = True
        while not state.done:
            t0 = time.perf_counter()
            req = C.model_request(state, contracts, state.model, state.config.max_output_tokens)
            budget = C.budget_request(state, req)
            evaluate(budget, ledger, warn_at=0.7, compact_at=0.8, fallback_model=None, exhausted_policy="stop")
            out = apply_model_response(state, await provider.complete(req), contracts)
            for item in out.items:
                if not item.subject.startswith(S.TOOL_EXECUTE_PREFIX):
                    continue
                call = ToolCall.model_validate_json(item.payload)
                hosted = registry.tools[call.tool]
                output = await hosted.fn(call.arguments, ToolContext(run_id, call.call_id, 1))
                raw = raw_result(call, output, 1)
                apply_outcome(state, outcome_of(hosted.contract, raw).outcome)
            if not first and not state.done:
                durations.append(time.perf_counter() - t0)
            first = False
    return durations


def report(r: dict[str, Any]) -> list[str]:
    k_top = r["levels"][-1]
    ratio = r["loop_p50_ms"] / r["floor_p50_ms"]
    lat_ratio = r["lat_many_s"] / r["lat_single_s"]
    growth = r["stepN_ms"] / r["step10_ms"]
    cpu = r[f"cpu_ms_{r['levels'][1]}"]
    note = " (quick: fewer/shorter runs)" if r["quick"] else ""

    def mark(ok: bool) -> str:
        return "met" if ok else "MISSED"

    bound = 2000 / cpu  # what 2 cores could carry at this CPU cost per step
    if "cpu_span" in r:
        n, last = r["cpu_span"], r["long_steps"]
        growth_cpu = (
            f"    CPU per step in that run (schedstat ns clock of every thread, read at each model turn), "
            f"steps 2-{1 + n} vs {last - n}-{last}: "
            f"all processes {r['cpu_early_ms']:.1f} -> {r['cpu_late_ms']:.1f} ms = "
            f"{r['cpu_late_ms'] / r['cpu_early_ms']:4.2f}x, planner {r['planner_early_ms']:.1f} -> "
            f"{r['planner_late_ms']:.1f} ms = {r['planner_late_ms'] / r['planner_early_ms']:4.2f}x"
        )
    else:
        growth_cpu = "    (too few model turns to compare CPU per step early and late)"
    lines = [
        f"agent steps (model turn + one tool call) through the real stack{note}; machine load average "
        f"{r['load_before']:.1f} before, {r['load_after']:.1f} after (2 cores: above 2, wall times include waiting "
        "for a core)",
        f"  per step, service loop     p50 {r['loop_p50_ms']:6.2f} ms  p99 {r['loop_p99_ms']:6.2f} ms"
        f"   target p50 <= 5 ms: {mark(r['loop_p50_ms'] <= 5)} (before: ~{BEFORE['p50_ms']:.0f} ms)",
        f"    ({len(r['loop_run_p50s'])} runs of {r['seq_steps']} steps, each run's p50: "
        + " ".join(f"{v:.2f}" for v in r["loop_run_p50s"])
        + " ms)",
        f"  per step, in one process   p50 {r['floor_p50_ms']:6.2f} ms  p99 {r['floor_p99_ms']:6.2f} ms"
        f"   service loop / in-process: {ratio:4.1f}x",
        f"  one JetStream publish round trip (PubAck) measured now: {r['rt_ms']:.2f} ms; a step's p50 is "
        f"{r['loop_p50_ms'] / r['rt_ms']:.1f} of them",
        "  steps/s            " + "".join(f"{k:>6} runs" for k in r["levels"]),
        "    1 replica each   " + "".join(f"{r[f'one_{k}']:10.0f}" for k in r["levels"]),
        "    2 planner+2 exec " + "".join(f"{r[f'two_{k}']:10.0f}" for k in r["levels"]),
        f"    target at {k_top} runs >= 3 x {BEFORE['steps_s_64']:.0f} = {3 * BEFORE['steps_s_64']:.0f}: "
        f"{mark(max(r[f'one_{k_top}'], r[f'two_{k_top}']) >= 3 * BEFORE['steps_s_64'])}",
        f"  latency-bound (1 s model, 0.5 s tool, 5 steps): one run {r['lat_single_s']:5.1f} s, "
        f"{r['lat_runs']} at once {r['lat_many_s']:5.1f} s = {lat_ratio:4.2f}x"
        f"   target <= 1.25x: {mark(lat_ratio <= 1.25)}",
        f"    ({r['lat_runs'] // 4} at once {r['lat_some_s']:5.1f} s = {r['lat_some_s'] / r['lat_single_s']:4.2f}x; "
        f"the {r['lat_runs']} runs used {r['lat_cpu_s']:.1f} CPU-s of the services and nats-server in "
        f"{r['lat_many_s']:.1f} s)",
        f"  long runs ({r['long_runs']}, each step the median over them): step 10 {r['step10_ms']:6.2f} ms, "
        f"step {r['long_steps']} {r['stepN_ms']:6.2f} ms = "
        f"{growth:4.2f}x   target <= 1.2x: {mark(growth <= 1.2)} (before: {BEFORE['step80_ratio']:.2f}x)",
        f"    run record in lw_runs: {r['record10_b']} bytes at step 10, {r['recordN_b']} at step {r['long_steps']} = "
        f"{r['recordN_b'] / max(1, r['record10_b']):4.2f}x",
        growth_cpu,
        "  CPU per step, all service processes + nats-server: "
        + ", ".join(f"{r[f'cpu_ms_{k}']:.1f} ms at {k} runs" for k in r["levels"])
        + f"   target <= {BEFORE['cpu_ms'] / 2:.1f} ms: {mark(cpu <= BEFORE['cpu_ms'] / 2)}"
        f" (before: {BEFORE['cpu_ms']} ms)",
        f"  at that CPU cost 2 idle cores carry at most ~{bound:.0f} steps/s",
    ]
    return lines
