"""The bus's floor (issue 36): what a step costs with Loopwarden's process split and nothing else - three
processes in a ring over JetStream (a planner, a tool executor, a validator), no domain code, measured in
the same invocation as the side-by-side.

Each hop is what Loopwarden's is: a message from a durable pull consumer (explicit ack, a long pull
request, the ack riding the next write), the next hop's message published and its PubAck awaited before
the ack. Three shapes (``PLANS``):

- **hand-offs only**: each process publishes the next hop's message and nothing else (3 stored messages a
  step) - the least any design with these three processes pays, durable or not;
- **+ run record, tool ledger**: the planner also saves the run's record before its hand-off, the executor its
  ledger entry (5 stored) - about the least that crash safety and exactly-once tool effects need;
- **as Loopwarden stores**: what Loopwarden's services store, in the same order and of about the same size (the
  planner the model's answer, then the run's record, then the two events, the two history entries and the
  command together; the executor its ledger entry, then the command; the validator its event) - 10 stored
  messages a step, as ``python -m bench --only step`` counts them.

A run is one message going round the ring ``steps`` times; ``runs`` at once are that many messages. The
file store and fsync are nats-server's defaults, as a local stack's. ``python -m bench --only step`` prints
the shapes beside the contenders, and CPU per step by process at one run beside Loopwarden's.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.throughput import sched_cpu_s
from loopwarden.stack import LocalStack

ROOT = str(Path(__file__).resolve().parent.parent)  # the role processes import this module from here
STREAM, STORE = "FLOOR", "FLOORSTORE"
HOPS = {"planner": "exec", "executor": "validate", "validator": "outcome"}  # role -> the subject it hands off on
CONSUMES = {"planner": "outcome", "executor": "exec", "validator": "validate"}

HAND_OFF = 0  # in a shape's groups: the next hop's message
# Per shape and role, what the role publishes for a step, in order: a group is published together (its PubAcks
# awaited together), a number is a stored message of that many bytes (about Loopwarden's at one run: the record
# ~4.5 KB, an event, a history entry or a ledger entry ~0.6-0.9 KB), HAND_OFF the next hop's message.
PLANS: dict[str, dict[str, list[tuple[int, ...]]]] = {
    "floor_handoffs": {role: [(HAND_OFF,)] for role in HOPS},
    # what exactly-once and crash safety need at the least: the run's record saved once, the tool's ledger entry
    "floor_durable": {
        "planner": [(4500,), (HAND_OFF,)],
        "executor": [(600,), (HAND_OFF,)],
        "validator": [(HAND_OFF,)],
    },
    "floor_stored": {
        # the model's answer; the run's record; then 2 events, 2 history entries and the command together
        "planner": [(800,), (4500,), (600, 600, 800, 800, HAND_OFF)],
        "executor": [(600,), (HAND_OFF,)],  # the ledger's entry, then the command
        "validator": [(HAND_OFF,)],  # its event is the hand-off
    },
}
SHAPES = {  # contender name -> its label in the side-by-side, and in a sentence
    "floor_handoffs": ("bus floor: hand-offs only (3 stored a step)", "hand-offs only"),
    "floor_durable": ("bus floor: + run record, tool ledger (5 stored)", "+ record and ledger"),
    "floor_stored": ("bus floor: as Loopwarden stores (10 stored)", "as Loopwarden stores"),
}


# --- a role: one process ---------------------------------------------------------------------------------
async def role(name: str, url: str) -> None:
    import nats

    async def quiet(err: Exception) -> None:  # what ends the role is said once, by ``main``
        pass

    nc = await nats.connect(url, name=f"floor-{name}", error_cb=quiet, max_reconnect_attempts=2, connect_timeout=2)
    js = nc.jetstream()
    inbox = nc.new_inbox()
    pads = {n: b"x" * n for plan in PLANS.values() for groups in plan.values() for g in groups for n in g}
    seq = 0

    async def handle(msg: Any) -> None:
        nonlocal seq
        body = json.loads(msg.data)
        left = body["left"] - (name == "planner")
        if left < 0:  # the run's last step came back: tell whoever waits
            await nc.publish(f"floor.done.{body['run']}", b"")
        else:
            out = json.dumps({**body, "left": left}).encode()
            for group in PLANS[body["shape"]][name]:
                seq += 1
                await asyncio.gather(
                    *(
                        js.publish(f"floor.{HOPS[name]}", out)
                        if n == HAND_OFF
                        else js.publish(f"floorstore.{name}.{seq}.{i}", pads[n])
                        for i, n in enumerate(group)
                    )
                )
        await nc.publish(msg.reply, b"")  # the ack: queued, it rides the next write

    tasks: set[asyncio.Task[None]] = set()

    async def on_msg(msg: Any) -> None:
        if not msg.reply:  # a pull's status (timeout, heartbeat)
            return
        task = asyncio.create_task(handle(msg))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    await nc.subscribe(inbox, cb=on_msg)
    nxt = f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.{CONSUMES[name]}"
    parent = os.getppid()
    while os.getppid() == parent:  # a role outlives no benchmark, however it ended
        # one long pull at a time, renewed before it expires, as the services' pulls are
        await nc.publish(nxt, json.dumps({"batch": 10_000, "expires": int(30e9)}).encode(), reply=inbox)
        for _ in range(25):
            await asyncio.sleep(1)
            if os.getppid() != parent:
                break
    await nc.close()


# --- the coordinator ---------------------------------------------------------------------------------------
@dataclass
class Floor:
    """A nats-server and the three role processes. ``ring`` sends runs round them and says ms per step;
    ``contenders`` are the shapes as the side-by-side calls them; ``cpu_ms`` keeps every ring's CPU ms per step
    by process (nats-server and each role), by shape and runs at once."""

    stack: LocalStack = field(default_factory=lambda: LocalStack(state_dir=Path(tempfile.mkdtemp(prefix="lw-floor-"))))
    roles: list[asyncio.subprocess.Process] = field(default_factory=list)
    cpu_ms: dict[tuple[str, int], list[dict[str, float]]] = field(default_factory=dict)
    nc: Any = None

    async def start(self) -> None:
        import nats
        from nats.js.api import AckPolicy, ConsumerConfig, StorageType, StreamConfig

        url = await asyncio.to_thread(self.stack.start_nats)
        self.nc = await nats.connect(url)
        js = self.nc.jetstream()
        await js.add_stream(StreamConfig(name=STREAM, subjects=["floor.exec", "floor.validate", "floor.outcome"],
                                         storage=StorageType.FILE))  # fmt: skip
        await js.add_stream(StreamConfig(name=STORE, subjects=["floorstore.>"], storage=StorageType.FILE))
        for durable in CONSUMES.values():
            cfg = ConsumerConfig(durable_name=durable, filter_subject=f"floor.{durable}", ack_policy=AckPolicy.EXPLICIT,
                                 ack_wait=30, max_ack_pending=1000)  # fmt: skip
            await js.add_consumer(STREAM, cfg)
        env = {**os.environ, "PYTHONPATH": ROOT}
        for name in HOPS:
            self.roles.append(
                await asyncio.create_subprocess_exec(sys.executable, "-m", "bench.bus_floor", name, url, env=env)
            )
        await self.ring("floor_handoffs", 1, 3)  # every role is up and pulling once a message has gone round
        self.cpu_ms.clear()

    def cpu_s(self) -> dict[str, float]:
        """CPU seconds so far of nats-server and each role."""
        pids = {p.name: p.popen.pid for p in self.stack.procs} | {
            n: r.pid for n, r in zip(HOPS, self.roles, strict=True)
        }
        return {name: sched_cpu_s(pid) for name, pid in pids.items()}

    async def ring(self, shape: str, runs: int, steps: int) -> float:
        ids = [uuid.uuid4().hex for _ in range(runs)]
        done = {i: asyncio.Event() for i in ids}

        async def on_done(msg: Any) -> None:
            if (event := done.get(msg.subject.rsplit(".", 1)[1])) is not None:
                event.set()

        sub = await self.nc.subscribe("floor.done.*", cb=on_done)
        js = self.nc.jetstream()
        cpu0 = self.cpu_s()
        t0 = time.perf_counter()
        starts = [json.dumps({"run": i, "left": steps, "shape": shape}).encode() for i in ids]
        await asyncio.gather(*(js.publish("floor.outcome", start) for start in starts))
        try:
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in done.values())), 120)
        except TimeoutError:
            gone = {n: r.returncode for n, r in zip(HOPS, self.roles, strict=True) if r.returncode is not None}
            raise RuntimeError(
                f"bus floor: {shape}, {runs} run(s) of {steps} steps not round in 120 s "
                f"(roles exited: {gone or 'none'})"
            ) from None
        wall = time.perf_counter() - t0
        per_step = {n: (v - cpu0[n]) / (runs * steps) * 1000 for n, v in self.cpu_s().items()}
        self.cpu_ms.setdefault((shape, runs), []).append(per_step)
        await sub.unsubscribe()
        return wall / (runs * steps) * 1000

    def contenders(self) -> dict[str, Any]:
        """Each shape as a side-by-side contender: (runs at once, steps per run) -> ms per step."""

        def one(shape: str) -> Any:
            async def steps(runs: int, n: int) -> float:
                return await self.ring(shape, runs, n)

            return steps

        return {shape: one(shape) for shape in SHAPES}

    def cpu_at_one_run(self) -> dict[str, dict[str, float]]:
        """Per shape, the median over its one-run rings of CPU ms per step, by process."""
        out = {}
        for (shape, runs), seen in self.cpu_ms.items():
            if runs == 1:
                out[shape] = {p: statistics.median(s[p] for s in seen) for p in seen[0]}
        return out

    async def stop(self) -> None:
        for r in self.roles:
            r.terminate()
        for r in self.roles:
            try:
                await asyncio.wait_for(r.wait(), 5)
            except TimeoutError:
                r.kill()
        if self.nc is not None:
            await self.nc.close()
        self.stack.stop()


def main(argv: list[str]) -> int:
    """A role's process: ``python -m bench.bus_floor ROLE NATS_URL`` (``Floor.start`` runs three)."""
    if len(argv) != 2 or argv[0] not in HOPS:
        print(f"usage: python -m bench.bus_floor {{{','.join(HOPS)}}} NATS_URL (got {argv})", file=sys.stderr)
        return 2
    import uvloop

    try:
        uvloop.run(role(argv[0], argv[1]))
    except KeyboardInterrupt:
        pass
    except Exception as err:  # the server gone or never there: one line, the role and the URL named
        print(f"bus floor {argv[0]} at {argv[1]}: {err!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
