"""What one step costs, counted (issue 36): NATS operations per step by service and kind, messages
into nats-server per step, CPU per step by process - from the difference between a long and a short
run of the same scenario, so the run's start and end cancel out.

The services count what their bus sends (``shared/opcounts.py``) and write it on SIGUSR1
(``LW_OP_COUNTS_DIR``); nats-server's monitoring endpoint (``/varz``, ``/connz``) says what every
connection sent it. Then the side-by-side (``bench.contenders``) with the bus's floor as contenders
(``bench.bus_floor``), and CPU per step by process of the floor beside Loopwarden's, at one run and with 64
runs at once. ``python -m bench --only step``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import bus_floor, contenders
from bench.throughput import ONE_EACH, floor_steps, run_many, sched_cpu_s, steps_scenario, write_calls
from loopwarden.client import Client
from loopwarden.stack import LocalStack, free_port
from shared.opcounts import CLEAN_UP, DELIVERIES, ROUND_TRIPS
from shared.settings import Settings

SERVICES = ("planner", "executor", "validator", "governor")  # on a step's path (judge, escalation: idle)


@dataclass
class Snapshot:
    """Everything counted at one moment: per service its operations by kind, per process its CPU
    seconds and its write system calls, per connection (by name) the messages it sent nats-server, and the
    server's total."""

    ops: dict[str, dict[str, int]] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)
    writes: dict[str, int] = field(default_factory=dict)
    conn_msgs: dict[str, int] = field(default_factory=dict)
    server_in: int = 0

    def minus(self, other: Snapshot) -> Snapshot:
        ops = {
            svc: {k: v - other.ops.get(svc, {}).get(k, 0) for k, v in counts.items()}
            for svc, counts in self.ops.items()
        }
        cpu = {p: v - other.cpu.get(p, 0.0) for p, v in self.cpu.items()}
        writes = {p: v - other.writes.get(p, 0) for p, v in self.writes.items()}
        conns = {c: v - other.conn_msgs.get(c, 0) for c, v in self.conn_msgs.items()}
        return Snapshot(ops, cpu, writes, conns, self.server_in - other.server_in)

    def scaled(self, by: float) -> dict[str, Any]:
        return {
            "ops": {s: {k: v / by for k, v in c.items()} for s, c in self.ops.items()},
            "cpu_ms": {p: v / by * 1000 for p, v in self.cpu.items()},
            "writes": {p: v / by for p, v in self.writes.items()},
            "conn_msgs": {c: v / by for c, v in self.conn_msgs.items()},
            "server_in": self.server_in / by,
        }


class Counter:
    def __init__(self, stack: LocalStack, counts_dir: Path, monitor_port: int) -> None:
        self.stack, self.dir, self.monitor = stack, counts_dir, monitor_port

    def monitoring(self, path: str) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.monitor}{path}", timeout=5) as resp:
            data: dict[str, Any] = json.loads(resp.read())
            return data

    async def snapshot(self) -> Snapshot:
        procs = [p for p in self.stack.procs if p.service]
        files = [self.dir / f"{p.service}-{p.popen.pid}.json" for p in procs]
        for f in files:  # each is written whole (a rename) on the signal: its presence is the answer
            f.unlink(missing_ok=True)  # (an mtime is no answer: the file system's clock may lag time.time())
        for p in procs:
            os.kill(p.popen.pid, signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while any(not f.exists() for f in files):
            if time.monotonic() > deadline:
                raise RuntimeError(f"no operation counts from {[str(f) for f in files if not f.exists()]}")
            await asyncio.sleep(0.02)
        snap = Snapshot()
        for p, f in zip(procs, files, strict=True):
            counts = json.loads(f.read_text())["counts"]
            mine = snap.ops.setdefault(p.service or p.name, {})
            for k, v in counts.items():
                mine[k] = mine.get(k, 0) + v
        snap.cpu = {p.name: sched_cpu_s(p.popen.pid) for p in self.stack.procs}
        snap.writes = {p.name: write_calls(p.popen.pid) for p in self.stack.procs}
        conns = self.monitoring("/connz?limit=4096")
        for c in conns.get("connections", []):
            name = str(c.get("name") or "?").removeprefix("loopwarden-")
            snap.conn_msgs[name] = snap.conn_msgs.get(name, 0) + int(c.get("in_msgs", 0))
        snap.server_in = int(self.monitoring("/varz").get("in_msgs", 0))
        return snap


async def per_step(
    counter: Counter, client: Client, short: int, long: int, rounds: int, runs: int = 1
) -> dict[str, Any]:
    """The difference between ``runs`` runs at once of ``long`` steps and as many of ``short`` steps, per step,
    summed over ``rounds`` pairs (a pair after another)."""
    total: Snapshot | None = None
    for _ in range(rounds):
        a = await counter.snapshot()
        await run_many(client, [steps_scenario(short) for _ in range(runs)])
        b = await counter.snapshot()
        await run_many(client, [steps_scenario(long) for _ in range(runs)])
        c = await counter.snapshot()
        d = c.minus(b).minus(b.minus(a))  # (long run) - (short run)
        total = d if total is None else _add(total, d)
    assert total is not None
    return total.scaled((long - short) * rounds * runs)


def _add(a: Snapshot, b: Snapshot) -> Snapshot:
    return a.minus(
        Snapshot(
            {s: {k: -v for k, v in c.items()} for s, c in b.ops.items()},
            {p: -v for p, v in b.cpu.items()},
            {p: -v for p, v in b.writes.items()},
            {c: -v for c, v in b.conn_msgs.items()},
            -b.server_in,
        )
    )


async def profiled(stack: LocalStack, client: Client, out: Path, seconds: float, runs: int) -> dict[str, float]:
    """Steps of ``runs`` runs at once for ``seconds`` under py-spy (``bench.profile``): CPU ms per step by
    process. At 16 runs the services batch their writes; at 1 every message is a write of its own."""
    from bench import profile

    procs = {p.name: p.popen.pid for p in stack.procs if p.service in SERVICES}
    spies = profile.start(procs, seconds, out)
    before = {n: sched_cpu_s(pid) for n, pid in procs.items()}
    steps, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        await run_many(client, [steps_scenario(20) for _ in range(runs)])
        steps += runs * 20
    cpu = {n: (sched_cpu_s(pid) - before[n]) / steps * 1000 for n, pid in procs.items()}
    for spy in spies:
        await asyncio.to_thread(spy.wait, 60)
    return cpu


def run(quick: bool = False, profile_dir: Path | None = None, profile_runs: int = 16) -> dict[str, Any]:
    counts_dir = Path(tempfile.mkdtemp(prefix="lw-opcounts-"))
    monitor = free_port()
    env = {"LW_LOG_LEVEL": "WARNING", "LW_OP_COUNTS_DIR": str(counts_dir)}
    stack = LocalStack(
        state_dir=Path(tempfile.mkdtemp(prefix="lw-bench-")), env=env, services=ONE_EACH, monitor_port=monitor
    )
    stack.start()
    try:

        async def main() -> dict[str, Any]:
            async with Client(Settings(nats_url=stack.nats_url)) as client:
                await run_many(client, [steps_scenario(3) for _ in range(4)])  # warm-up
                counter = Counter(stack, counts_dir, monitor)
                short, long = (4, 12) if quick else (10, 40)
                r = await per_step(counter, client, short, long, rounds=1 if quick else 3)
                r["load"] = os.getloadavg()[0]

                procs = {p.name: p.popen.pid for p in stack.procs}
                batches: dict[
                    tuple[int, int], list[dict[str, float]]
                ] = {}  # its CPU seconds by process, as the floor's

                async def loopwarden(runs: int, steps: int) -> float:
                    cpu0 = {n: sched_cpu_s(pid) for n, pid in procs.items()}
                    wall, _ = await run_many(client, [steps_scenario(steps) for _ in range(runs)])
                    cpu = {n: sched_cpu_s(pid) - cpu0[n] for n, pid in procs.items()}
                    batches.setdefault((runs, steps), []).append(cpu)
                    return wall / (runs * steps) * 1000

                floor = bus_floor.Floor()
                try:
                    await floor.start()
                    r["side"] = await contenders.measure(loopwarden, 1 if quick else 5, extra=floor.contenders())
                    (_, short_), (_, long_) = contenders.SHAPES[:2]  # 1 run of 10 steps, 1 of 40
                    r["floor_cpu_ms"] = {s: floor.cpu_per_step("side", s, 1, short_, long_) for s in bus_floor.SHAPES}
                    r["side_cpu_ms"] = bus_floor.cpu_between(
                        batches[(1, short_)], batches[(1, long_)], 1, short_, long_
                    )
                    r["many"] = await many_at_once(counter, client, floor, quick)
                finally:
                    await floor.stop()
                r["load_after"] = os.getloadavg()[0]
                if profile_dir is not None:
                    seconds = 8 if quick else 20
                    r["profile_cpu_ms"] = await profiled(stack, client, profile_dir, seconds, profile_runs)
                    r["profile_dir"], r["profile_runs"] = profile_dir, profile_runs
                return r

        r = asyncio.run(main())
    finally:
        stack.stop()
    own = asyncio.run(floor_steps(1 if quick else 5, 40))
    r["own_floor_ms"] = statistics.median(own) * 1000
    return r


async def many_at_once(counter: Counter, client: Client, floor: bus_floor.Floor, quick: bool) -> dict[str, Any]:
    """CPU ms per step by process with many runs at once, without each run's start and end (``per_step`` with
    ``runs`` runs at once), and the bus's floor as Loopwarden stores measured the same way, in the same rounds.
    ``python -m bench.throughput``'s CPU per step at 64 runs has the runs' starts and ends in it (runs of 20
    steps)."""
    runs, short, long, rounds = (8, 4, 10, 1) if quick else (64, 10, 30, 3)
    mine = []
    for _ in range(rounds):  # one round each, in turn
        mine.append((await per_step(counter, client, short, long, rounds=1, runs=runs))["cpu_ms"])
        for steps in (short, long):
            await floor.ring("floor_stored", runs, steps, tag="many")
    return {
        "runs": runs,
        "steps": (short, long),
        "step_ms": {p: statistics.median(m[p] for m in mine) for p in mine[0]},
        "floor_ms": floor.cpu_per_step("many", "floor_stored", runs, short, long),
        "load": os.getloadavg()[0],
    }


def side_by_side(r: dict[str, Any]) -> list[str]:
    side: dict[str, dict[tuple[int, int], float]] = r["side"]
    shapes = contenders.SHAPES
    lines = [
        f"side by side (issue 36; instant model and tool, ms per step = a run's wall time / its steps, interleaved "
        f"rounds, medians; load {r['load']:.1f} -> {r['load_after']:.1f})",
        "  "
        + f"{'':54}"
        + "".join(f"{f'{n} run, {s} steps' if n == 1 else f'{n} runs at once':>18}" for n, s in shapes),
    ]
    for name, by in side.items():
        lines.append("  " + f"{contenders.label(name):54}" + "".join(f"{by[s]:18.2f}" for s in shapes))
    lines.append(
        f"  {'Loopwarden domain code in one process (no bus)':54}{r['own_floor_ms']:18.2f}"
        "   (a step's p50, bench.throughput)"
    )
    lw = side["loopwarden"]
    if "pydanticai" in side:
        floor, what = side["pydanticai"], "PydanticAI in one process"
    else:
        floor, what = (
            {s: r["own_floor_ms"] for s in shapes},
            "Loopwarden's own loop in one process (no contender installed)",
        )
    ratio = lw[shapes[0]] / floor[shapes[0]]
    lines.append(
        f"  a step at one run / the in-process loop ({what}): {ratio:.2f}x   target <= 2.0x: "
        f"{'met' if ratio <= 2.0 else 'MISSED'}"
        f" (40 steps {lw[shapes[1]] / floor[shapes[1]]:.2f}x, 16 runs {lw[shapes[2]] / floor[shapes[2]]:.2f}x)"
    )
    if "langgraph" in side:
        lg = side["langgraph"]
        a, b = lg[shapes[0]] / lw[shapes[0]], lg[shapes[1]] / lw[shapes[1]]
        lines.append(
            f"  LangGraph + SQLite / Loopwarden: 10 steps {a:.2f}x, 40 steps {b:.2f}x   target >= 1.5x both: "
            f"{'met' if min(a, b) >= 1.5 else 'MISSED'}"
        )
        if all(shape in side for shape in bus_floor.SHAPES):
            bus = "; ".join(
                f"{side[name][shapes[0]]:.2f} / {side[name][shapes[1]]:.2f} {what}"
                for name, (_, what) in bus_floor.SHAPES.items()
            )
            lines.append(
                f"    (met needs a step of at most {lg[shapes[0]] / 1.5:.2f} / {lg[shapes[1]] / 1.5:.2f} ms at 10 / 40"
                f" steps; the bus alone, no code, takes {bus})"
            )
    else:
        lines.append("  LangGraph + SQLite: not installed (pip install -e '.[bench]')")
    lines += floor_cpu(r)
    return lines


def floor_cpu(r: dict[str, Any]) -> list[str]:
    """CPU per step by process, the bus's floor beside Loopwarden, at one run and with many at once: what is
    above the floor is what Loopwarden's own code spends."""
    floor: dict[str, dict[str, float]] = r.get("floor_cpu_ms", {})
    if not floor:
        return []
    procs = ("nats-server", *bus_floor.RING)

    def table(rows: dict[str, dict[str, float]]) -> list[str]:
        out = ["  " + f"{'':54}" + "".join(f"{p:>13}" for p in (*procs, "others", "all"))]
        for name, by in rows.items():
            shown = [by.get(p, 0.0) for p in procs]
            total = sum(by.values())
            out.append("  " + f"{name:54}" + "".join(f"{v:13.2f}" for v in (*shown, total - sum(shown), total)))
        return out

    lines = [
        "  CPU per step at one run, ms, by process: the bus floor beside Loopwarden (bench.bus_floor), from the"
        " side-by-side's rounds (its 40-step run less its 10-step one, medians)"
    ]
    lines += table(
        {bus_floor.SHAPES[s][0]: c for s, c in floor.items()} | {"Loopwarden (one replica each)": r["side_cpu_ms"]}
    )
    many = r.get("many")
    if many:
        n, (short, long) = many["runs"], many["steps"]
        lines.append(
            f"  CPU per step at {n} runs at once, ms, by process: {n} runs of {long} steps less {n} of {short},"
            f" no run's start or end (load {many['load']:.1f})"
        )
        lines += table(
            {
                bus_floor.SHAPES["floor_stored"][0]: many["floor_ms"],
                "Loopwarden (one replica each)": many["step_ms"],
            }
        )
    return lines


def round_trips(ops: dict[str, dict[str, float]]) -> float:
    return sum(v for counts in ops.values() for k, v in counts.items() if k in ROUND_TRIPS)


def report(r: dict[str, Any]) -> list[str]:
    ops: dict[str, dict[str, float]] = r["ops"]
    kinds = [k for k in (*ROUND_TRIPS, *CLEAN_UP, *DELIVERIES) if any(c.get(k, 0) >= 0.05 for c in ops.values())]
    shown = [s for s in (*SERVICES, *sorted(set(ops) - set(SERVICES))) if s in ops]
    lines = [
        f"operations per step, by service and kind (a 40-step run less a 10-step one; load {r['load']:.1f})",
        "  " + f"{'':12}" + "".join(f"{k:>14}" for k in kinds) + f"{'round trips':>14}",
    ]
    for s in shown:
        c = ops[s]
        rts = sum(v for k, v in c.items() if k in ROUND_TRIPS)
        if rts < 0.05 and sum(c.values()) < 0.05:
            continue
        lines.append("  " + f"{s:12}" + "".join(f"{c.get(k, 0):14.2f}" for k in kinds) + f"{rts:14.2f}")
    total = round_trips(ops)
    lines.append(
        f"  round trips per step (publish with ack, KV get/put, direct get, request/reply, payload): {total:.1f}"
        f"   target <= 12: {'met' if total <= 12 else 'MISSED'}"
    )
    removed = sum(c.get("remove", 0) for c in ops.values())
    lines.append(
        f"  clean-up per step, after the run ended, awaited by no handler (handled commands deleted): {removed:.1f}"
    )
    conns = r["conn_msgs"]
    lines.append(
        f"  messages into nats-server per step: {r['server_in']:.1f} ("
        + ", ".join(f"{c} {v:.1f}" for c, v in sorted(conns.items(), key=lambda kv: -kv[1]) if v >= 0.05)
        + ")"
    )
    cpu = r["cpu_ms"]
    lines.append(
        f"  CPU per step by process (schedstat): {sum(cpu.values()):.2f} ms = "
        + ", ".join(f"{p} {v:.2f}" for p, v in sorted(cpu.items(), key=lambda kv: -kv[1]) if v >= 0.01)
    )
    writes = r["writes"]
    lines.append(
        f"  write system calls per step by process (/proc/PID/io syscw): {sum(writes.values()):.1f} = "
        + ", ".join(f"{p} {v:.2f}" for p, v in sorted(writes.items(), key=lambda kv: -kv[1]) if v >= 0.05)
    )
    lines += side_by_side(r)
    if "profile_dir" in r:
        from bench import profile

        lines += profile.report(r["profile_dir"], r["profile_cpu_ms"], r["profile_runs"])
    return lines
