"""Fair share between tenants on one fleet (issue 34): tenant b's runs behind tenant a's burst.

Two planner and two executor replicas; every run is a 2-turn agent whose model turns take 0.5 s (the
scripted provider's ``latency_s``): a calculator call, then the answer. In one invocation, on one stack:

- b alone: b's 20 runs, each timed from its submit to its final event (twice, before and after the rest);
- a alone: tenant a's 1,000 runs at once: runs/s from the first submit to the last final event;
- b behind a: a's 1,000 are published, then b's 20 (they reach the submit stream after a's): b's latencies.

CPU per finished run of a alone: CPU seconds of every process of the stack (nats-server included), to the
nanosecond (``/proc/PID/task/*/schedstat``), over the phase, divided by its runs. On a shared machine it is far
steadier than runs/s (which other work on the machine moves), so it is the figure to compare trees by.
``python -m bench.fairness --alone [--rounds N]`` measures only that phase (after a warm-up), N times on one stack.

Figures are ratios against the baselines measured in the same invocation (b alone; a alone), as the issue
asks: b's p50 and p95 behind a at most 1.5x b's alone. The same module measures an unchanged checkout of
an earlier release the same way (the submits are plain JetStream publishes on each tenant's subject and
completion is the run's final event, which every release publishes), so ``docs/benchmarks.md`` can put
today's code beside the earlier one.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.throughput import sched_cpu_s  # the release before flow control has it too
from loopwarden.client import Client
from loopwarden.stack import LocalStack, free_port
from shared import subjects as S
from shared.bus import RUN_ID_HEADER
from shared.canonical import digest_of
from shared.messages import RunLimits, RunSubmit
from shared.scenario import Scenario, parse_scenario
from shared.settings import Settings

try:
    from loopwarden.client import submit_id
except ImportError:  # an earlier release (the tree before flow control): the id it wrote by hand

    def submit_id(run_id: str) -> str:
        return f"submit.{run_id}"


TWO_TWO = ("planner", "planner", "executor", "executor", "validator", "judge", "governor", "escalation")
ENV = {"LW_LOG_LEVEL": "WARNING"}
ENDED = ("completed", "stopped", "failed", "refused")
# a two_turns run's hops after its start, each timed to the event that ends it
HOPS = ("start -> turn 1", "turn 1 -> tool result", "tool result -> turn 2", "turn 2 -> final")
IDLE_S = 5.0  # how long ``--alone`` measures the stack's CPU with no run going


def two_turns(model_s: float = 0.5) -> Scenario:
    """A 2-turn agent: a calculator call, then the answer; each model turn takes ``model_s``."""
    seed = uuid.uuid4().int % 10_000
    return parse_scenario(
        {
            "name": "two-turns",
            "task": "Add the numbers, then say done.",
            "planner": [
                {"latency_s": model_s, "tool_calls": [{"name": "calculator", "input": {"expression": f"1+{seed}"}}]},
                {"latency_s": model_s, "text": "done"},
            ],
            "answer_mode": "text",
            "limits": {"max_iterations": 5, "cost_ceiling_usd": 10_000, "run_token_budget": 50_000_000},
        }
    )


def submit_of(scenario: Scenario) -> RunSubmit:
    data = scenario.model_dump(mode="json", by_alias=True)
    return RunSubmit(
        run_id=f"run-{uuid.uuid4().hex[:20]}",
        task=scenario.task,
        rubric=scenario.effective_rubric(),
        limits=scenario.limits or RunLimits(),
        answer_mode=scenario.answer_mode,
        terminal_tools=scenario.terminal_tools,
        scenario=data,
        scenario_digest=digest_of(data),
    )


@dataclass
class Finishes:
    """When each run's final event arrived (a wildcard subscription: no per-run subscription or read)."""

    at: dict[str, float] = field(default_factory=dict)
    status: dict[str, str] = field(default_factory=dict)
    waiters: dict[str, asyncio.Future[float]] = field(default_factory=dict)
    started: dict[str, float] = field(default_factory=dict)  # its run.started (admitted, on a release that queues)
    accepted: dict[str, float] = field(default_factory=dict)  # its first run.queued or run.started: taken in
    # when each hop's event of a traced run (b's) arrived: its model turns, its tool results
    hops: dict[str, list[float]] = field(default_factory=dict)
    client: Any = None  # what ``start`` subscribed with

    async def start(self, client: Client) -> None:
        async def on_start(msg: Any) -> None:
            rid = (msg.headers or {}).get(RUN_ID_HEADER, "") or msg.subject.rsplit(".", 1)[-1]
            now = time.perf_counter()
            self.accepted.setdefault(rid, now)
            if msg.subject.split(".")[4] == "started":
                self.started.setdefault(rid, now)

        for kind in ("queued", "started"):
            await client.bus.nc.subscribe(S.any_run(S.run_event(kind)), cb=on_start)

        async def on_msg(msg: Any) -> None:
            rid = (msg.headers or {}).get(RUN_ID_HEADER, "") or msg.subject.rsplit(".", 1)[-1]
            if rid in self.at:
                return
            now = time.perf_counter()
            self.at[rid] = now
            self.status[rid] = msg.subject.split(".")[4]
            fut = self.waiters.pop(rid, None)
            if fut is not None and not fut.done():
                fut.set_result(now)

        for status in ENDED:
            await client.bus.nc.subscribe(S.any_run(S.run_event(status)), cb=on_msg)
        self.client = client

    async def trace(self, run_ids: list[str]) -> None:
        """Time every hop of these runs (their model turns' and tool results' events): subscribed per run, so the
        server sends this process only theirs, not the burst's thousands."""

        async def on_hop(msg: Any) -> None:
            rid = msg.subject.rsplit(".", 1)[-1]
            self.hops.setdefault(rid, []).append(time.perf_counter())

        for rid in run_ids:
            await self.client.bus.nc.subscribe(f"{S.run_event('model_called')}.{rid}", cb=on_hop)
            await self.client.bus.nc.subscribe(f"{S.TOOL_SUCCEEDED_PREFIX}.*.{rid}", cb=on_hop)  # any tool

    async def until(self, run_ids: list[str], timeout: float) -> None:
        loop = asyncio.get_running_loop()
        futs = []
        for rid in run_ids:
            if rid not in self.at:
                futs.append(self.waiters.setdefault(rid, loop.create_future()))
        if futs:
            _, pending = await asyncio.wait(futs, timeout=timeout)
            if pending:
                raise RuntimeError(f"{len(pending)} of {len(run_ids)} runs did not end in {timeout:.0f}s")


async def publish(client: Client, tenant: str, submits: list[RunSubmit]) -> float:
    """Publish the submits on ``tenant``'s subject, all at once; when the first went out."""
    t0 = time.perf_counter()
    subject = S.run_submit(tenant)
    await asyncio.gather(*(client.bus.publish(subject, s, msg_id=submit_id(s.run_id)) for s in submits))
    return t0


async def latencies(
    client: Client, finishes: Finishes, tenant: str, n: int, timeout: float, parts: dict[str, list[float]] | None = None
) -> list[float]:
    """``n`` runs of ``tenant`` submitted at once; each one's time from its submit to its final event (``parts``:
    also to its intake and to its start)."""
    submits = [submit_of(two_turns()) for _ in range(n)]
    started = {}
    if parts is not None:
        await finishes.trace([s.run_id for s in submits])
    subject = S.run_submit(tenant)

    async def one(s: RunSubmit) -> None:
        started[s.run_id] = time.perf_counter()
        await client.bus.publish(subject, s, msg_id=submit_id(s.run_id))

    await asyncio.gather(*(one(s) for s in submits))
    await finishes.until([s.run_id for s in submits], timeout)
    if parts is not None:
        ids = [s.run_id for s in submits]
        parts.setdefault("intake", []).extend(finishes.accepted[r] - started[r] for r in ids if r in finishes.accepted)
        parts.setdefault("start", []).extend(finishes.started[r] - started[r] for r in ids if r in finishes.started)
        # each hop after the start: first model turn, tool result, second model turn, final event
        for rid in ids:
            if rid not in finishes.started or rid not in finishes.at:
                continue
            marks = [finishes.started[rid], *finishes.hops.get(rid, []), finishes.at[rid]]
            if len(marks) == len(HOPS) + 1:
                for name, a, b in zip(HOPS, marks, marks[1:], strict=False):
                    parts.setdefault(name, []).append(max(0.0, b - a))  # the last two leave together
    return [finishes.at[s.run_id] - started[s.run_id] for s in submits]


async def warmed(client: Client, timeout: float) -> Finishes:
    """Final events followed from now, after 8 of b's runs warmed the stack up."""
    finishes = Finishes()
    await finishes.start(client)
    await latencies(client, finishes, "b", 8, timeout)
    return finishes


def cpu_by_process(stack: LocalStack) -> dict[str, float]:
    """CPU seconds so far of each process of the stack, by its name (``planner#2`` the second replica)."""
    return {proc.name: sched_cpu_s(proc.popen.pid) for proc in stack.procs}


async def alone_phase(
    client: Client, finishes: Finishes, stack: LocalStack, burst: int, timeout: float
) -> dict[str, Any]:
    """Tenant a's ``burst`` runs at once, nothing else: its wall time and the CPU the stack spent, by process."""
    submits = [submit_of(two_turns()) for _ in range(burst)]
    c0 = cpu_by_process(stack)
    t0 = await publish(client, "a", submits)
    await finishes.until([s.run_id for s in submits], timeout)
    wall = max(finishes.at[s.run_id] for s in submits) - t0
    await asyncio.sleep(0.5)  # what the last runs' ends still cost (acks, records) counts as theirs
    c1 = cpu_by_process(stack)
    return {"wall_s": wall, "cpu_s": {k: c1[k] - c0.get(k, 0.0) for k in c1}, "runs": burst}


def cpu_ms_per_run(phase: dict[str, Any]) -> float:
    runs: int = phase["runs"]
    return float(sum(phase["cpu_s"].values())) / runs * 1000


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(burst: int = 1000, small: int = 20, env: dict[str, str] | None = None) -> dict[str, Any]:
    stack = LocalStack(
        state_dir=Path(tempfile.mkdtemp(prefix="lw-bench-fair-")), env={**ENV, **(env or {})}, services=TWO_TWO
    )
    r: dict[str, Any] = {"burst": burst, "small": small, "load_before": os.getloadavg()[0]}
    timeout = max(120.0, burst * 0.5)
    stack.start()
    try:

        async def main() -> None:
            async with Client(Settings(nats_url=stack.nats_url)) as client:
                finishes = await warmed(client, timeout)
                alone_parts: dict[str, list[float]] = {}
                alone = await latencies(client, finishes, "b", small, timeout, alone_parts)
                # a alone: throughput
                phase = await alone_phase(client, finishes, stack, burst, timeout)
                r["a_alone_s"], r["a_alone_cpu"] = phase["wall_s"], phase
                alone += await latencies(client, finishes, "b", small, timeout, alone_parts)
                # b behind a's burst
                burst_a = [submit_of(two_turns()) for _ in range(burst)]
                t0 = await publish(client, "a", burst_a)
                parts: dict[str, list[float]] = {}
                behind = await latencies(client, finishes, "b", small, timeout, parts)
                r["b_parts"], r["b_alone_parts"] = parts, alone_parts
                await finishes.until([s.run_id for s in burst_a], timeout)
                r["a_shared_s"] = max(finishes.at[s.run_id] for s in burst_a) - t0
                r["b_alone"], r["b_behind"] = alone, behind
                ended = [finishes.status.get(s.run_id) for s in burst_a]
                r["not_completed"] = sum(1 for s in ended if s != "completed")

        asyncio.run(main())
    finally:
        stack.stop()
    r["load_after"] = os.getloadavg()[0]
    return r


def report(r: dict[str, Any]) -> list[str]:
    alone, behind = r["b_alone"], r["b_behind"]
    p50_ratio = pct(behind, 0.5) / pct(alone, 0.5)
    p95_ratio = pct(behind, 0.95) / pct(alone, 0.95)

    def mark(ok: bool) -> str:
        return "met" if ok else "MISSED"

    return [
        f"fair share (2 planner + 2 executor replicas, 2-turn agent, 0.5 s model turns); machine load average "
        f"{r['load_before']:.1f} before, {r['load_after']:.1f} after",
        f"  tenant b alone ({len(alone)} runs):   p50 {pct(alone, 0.5):6.2f} s  p95 {pct(alone, 0.95):6.2f} s",
        f"  b behind a's {r['burst']} ({len(behind)} runs): p50 {pct(behind, 0.5):6.2f} s  "
        f"p95 {pct(behind, 0.95):6.2f} s",
        f"    = {p50_ratio:4.2f}x (p50), {p95_ratio:4.2f}x (p95) b alone   target <= 1.5x: "
        f"{mark(p50_ratio <= 1.5 and p95_ratio <= 1.5)}",
        "    b behind a: submit -> taken in (queued or started) p50 "
        + (f"{pct(r['b_parts']['intake'], 0.5):.2f} s" if r["b_parts"].get("intake") else "-")
        + ", submit -> started p50 "
        + (f"{pct(r['b_parts']['start'], 0.5):.2f} s" if r["b_parts"].get("start") else "-"),
        "    where b's time goes, p50 alone -> behind a: "
        + ", ".join(
            f"{name} {pct(r['b_alone_parts'][name], 0.5):.2f} -> {pct(r['b_parts'][name], 0.5):.2f} s"
            for name in ("start", *HOPS)
            if r["b_alone_parts"].get(name) and r["b_parts"].get(name)
        ),
        f"  tenant a alone: {r['burst']} runs in {r['a_alone_s']:.1f} s = {r['burst'] / r['a_alone_s']:.1f} runs/s; "
        f"with b's beside: {r['a_shared_s']:.1f} s; runs of a's not completed: {r['not_completed']}",
        "  " + cpu_line(r["a_alone_cpu"]),
    ]


def cpu_line(phase: dict[str, Any]) -> str:
    summed: dict[str, float] = {}
    for name, cpu in phase["cpu_s"].items():  # replicas together
        summed[name.split("#")[0]] = summed.get(name.split("#")[0], 0.0) + cpu
    by = ", ".join(f"{k} {v / phase['runs'] * 1000:.1f}" for k, v in sorted(summed.items(), key=lambda kv: -kv[1]))
    return f"a alone: CPU per finished run {cpu_ms_per_run(phase):.1f} ms, all processes ({by})"


def run_alone(
    burst: int = 1000,
    rounds: int = 3,
    env: dict[str, str] | None = None,
    profile_dir: Path | None = None,
    ops: bool = False,
) -> list[dict[str, Any]]:
    """Only tenant a alone, ``rounds`` times on one stack after a warm-up: each round's runs/s and CPU per run
    (``profile_dir``: py-spy on every process but nats-server through the last round, stacks kept there; ``ops``:
    the operations each service sent per run in the last round, and the messages nats-server took in, as
    ``bench/step.py`` counts them)."""
    from bench import step

    extra: dict[str, str] = {}
    monitor = None
    if ops:
        extra["LW_OP_COUNTS_DIR"] = tempfile.mkdtemp(prefix="lw-opcounts-")
        monitor = free_port()
    stack = LocalStack(
        state_dir=Path(tempfile.mkdtemp(prefix="lw-bench-fair-")),
        env={**ENV, **extra, **(env or {})},
        services=TWO_TWO,
        monitor_port=monitor,
    )
    out: list[dict[str, Any]] = []
    idle: dict[str, float] = {}
    timeout = max(120.0, burst * 0.5)
    stack.start()
    try:

        async def main() -> None:
            async with Client(Settings(nats_url=stack.nats_url)) as client:
                finishes = await warmed(client, timeout)
                idle.update(await idle_cpu(stack, IDLE_S))
                for k in range(rounds):
                    load = os.getloadavg()[0]
                    spies = []
                    if profile_dir is not None and k == rounds - 1:
                        from bench import profile

                        pids = {p.name: p.popen.pid for p in stack.procs if p.name != "nats-server"}
                        spies = profile.start(pids, burst / 100, profile_dir)
                        await asyncio.sleep(1.0)  # py-spy attached
                    counter = step.Counter(stack, Path(extra["LW_OP_COUNTS_DIR"]), monitor) if monitor else None
                    before = await counter.snapshot() if counter is not None and k == rounds - 1 else None
                    phase = await alone_phase(client, finishes, stack, burst, timeout)
                    if counter is not None and before is not None:
                        phase["ops"] = (await counter.snapshot()).minus(before).scaled(burst)
                    for spy in spies:
                        spy.wait()
                    phase["load"] = load
                    out.append(phase)

        asyncio.run(main())
    finally:
        stack.stop()
    for phase in out:
        phase["idle_cpu_s"] = idle
    return out


async def idle_cpu(stack: LocalStack, seconds: float) -> dict[str, float]:
    """CPU seconds per second of each process with no run going: what a phase's CPU includes whatever it runs."""
    await asyncio.sleep(1.0)  # the warm-up's last acks and writes
    c0 = cpu_by_process(stack)
    await asyncio.sleep(seconds)
    c1 = cpu_by_process(stack)
    return {k: (c1[k] - c0.get(k, 0.0)) / seconds for k in c1}


def report_alone(phases: list[dict[str, Any]]) -> list[str]:
    lines = [
        f"a alone round {k + 1}: {p['runs']} runs in {p['wall_s']:.1f} s = {p['runs'] / p['wall_s']:.1f} runs/s "
        f"(load {p['load']:.1f}); {cpu_line(p)}"
        for k, p in enumerate(phases)
    ]
    if phases:
        idle = phases[0]["idle_cpu_s"]
        lines.append(
            f"  idle (no run going): {sum(idle.values()) * 1000:.0f} ms CPU per second, all processes ("
            + ", ".join(f"{k} {v * 1000:.0f}" for k, v in sorted(idle.items(), key=lambda kv: -kv[1]) if v >= 0.0005)
            + ")"
        )
    counted = phases[-1].get("ops") if phases else None
    if counted:
        lines.append(f"  operations per run, last round (nats-server took in {counted['server_in']:.1f} messages):")
        for service, kinds in sorted(counted["ops"].items()):
            lines.append(
                f"    {service:11}" + ", ".join(f"{k} {v:.2f}" for k, v in sorted(kinds.items()) if v >= 0.005)
            )
    return lines


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(prog="bench.fairness")
    parser.add_argument("--alone", action="store_true", help="only tenant a alone: runs/s and CPU per run")
    parser.add_argument("--rounds", type=int, default=3, help="with --alone: how many bursts on the one stack")
    parser.add_argument("--burst", type=int, default=1000)
    parser.add_argument("--profile", metavar="DIR", help="with --alone: py-spy the services in the last round")
    parser.add_argument("--ops", action="store_true", help="with --alone: operations per run in the last round")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="a setting of the services")
    args = parser.parse_args()
    env = dict(kv.split("=", 1) for kv in args.env)
    if args.alone:
        out = Path(args.profile) if args.profile else None
        phases = run_alone(burst=args.burst, rounds=args.rounds, env=env, profile_dir=out, ops=args.ops)
        print("\n".join(report_alone(phases)), flush=True)
        if out is not None:
            from bench import profile

            last = phases[-1]
            names = {p.stem for p in out.glob("*.txt")}
            per_run = {n: last["cpu_s"].get(n, 0.0) / last["runs"] * 1000 for n in names}
            print("\n".join(profile.report(out, per_run)).replace("per step", "per run"), flush=True)
    else:
        print("\n".join(report(run(burst=args.burst, env=env))), flush=True)
