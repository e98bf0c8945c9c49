"""The bus's floor (issue 36): what a step costs with Loopwarden's process split and nothing else - three
processes in a ring over JetStream (a planner, a tool executor, a validator), no domain code, measured in
the same invocation as the side-by-side.

Each hop does what a Loopwarden hop must and sends it as Loopwarden's bus does: a message from a durable pull
consumer (explicit ack, long pull requests), every stored message published with a ``Nats-Msg-Id`` (what
exactly-once de-duplicates by) through the bus's reply collector (``shared/bus/replies.py``: one inbox, a
future per PubAck), the PubAcks awaited before the ack, and the ack riding the connection's next write
(``shared/bus/acks.py``). What a Loopwarden hop adds - decoding, its own code, encoding, the headers it carries
- is what the floor leaves out. Three shapes (``PLANS``):

- **hand-offs only**: each process publishes the next hop's message and nothing else (3 stored messages a
  step) - the least a design that hands off through JetStream between these three processes pays;
- **+ run record, tool ledger**: the planner also saves the run's record before its hand-off, the executor its
  ledger entry (5 stored) - about the least that crash safety and exactly-once tool effects need;
- **as Loopwarden stores**: what Loopwarden's services store, with the same waits between them and of about
  the same size (10 stored: counted per subject by ``python -m bench --only step``). The planner stores the
  model's answer while it saves the run's record (``ModelTurns`` stores the answer in the background, the
  record's save awaits it at the end), then the two events, the two history entries and the command
  together; the executor its ledger entry, then the command; the validator its event.

A run is one message going round the ring ``steps`` times; ``runs`` at once are that many messages. The
file store and fsync are nats-server's defaults, as a local stack's. ``python -m bench --only step`` prints
the shapes beside the contenders, and CPU per step by process - each ring's CPU, a longer ring's less a
shorter one's, so a run's start and end cancel out as in Loopwarden's figures - beside Loopwarden's.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import shutil
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # the coordinator's (a role imports the bus's sending parts, and with them the bus package)
    from nats.aio.client import Client as NatsClient

    from bench.contenders import Contender
    from loopwarden.stack import LocalStack

ROOT = str(Path(__file__).resolve().parent.parent)  # the role processes import this module from here
STREAM, STORE = "FLOOR", "FLOORSTORE"
RING = {"planner": "exec", "executor": "validate", "validator": "outcome"}  # role -> the subject it hands off on
_ORDER = list(RING)
CONSUMES = {_ORDER[(i + 1) % len(_ORDER)]: RING[r] for i, r in enumerate(_ORDER)}  # role -> what the one before sends
BATCH = 1_000  # messages a pull asks for; a role asks again once it has half of them

HAND_OFF: Literal["hand-off"] = "hand-off"
Group = tuple[int | Literal["hand-off"], ...]
# Per shape and role, what the role publishes for a step, in order: a group is published together (its PubAcks
# awaited together); a number is a stored message of that many bytes (about Loopwarden's at one run: the record
# ~4.5 KB, the model's answer, an event, a history entry or a ledger entry ~0.6-0.9 KB), HAND_OFF the next hop's.
PLANS: dict[str, dict[str, list[Group]]] = {
    "floor_handoffs": {role: [(HAND_OFF,)] for role in RING},
    "floor_durable": {
        "planner": [(4500,), (HAND_OFF,)],  # the run's record, then the command
        "executor": [(600,), (HAND_OFF,)],  # the ledger's entry, then the command
        "validator": [(HAND_OFF,)],
    },
    "floor_stored": {
        # the model's answer and the run's record; then 2 events, 2 history entries and the command
        "planner": [(800, 4500), (600, 600, 800, 800, HAND_OFF)],
        "executor": [(600,), (HAND_OFF,)],
        "validator": [(HAND_OFF,)],  # its event is the hand-off
    },
}
WHAT = {
    "floor_handoffs": "hand-offs only",
    "floor_durable": "+ run record, tool ledger",
    "floor_stored": "as Loopwarden stores",
}


def stored(shape: str) -> int:
    """Messages the shape stores a step (its hand-offs included)."""
    return sum(len(group) for groups in PLANS[shape].values() for group in groups)


SHAPES = {shape: (f"bus floor: {what} ({stored(shape)} stored a step)", what) for shape, what in WHAT.items()}
"""Contender name -> its label in the side-by-side, and in a sentence."""


# --- a role: one process ---------------------------------------------------------------------------------
async def role(name: str, url: str) -> None:
    """One hop of the ring: take a message from this role's durable, publish what the message's shape says this
    role stores and hands off, ack it. Ends when the process that started it is gone, or at a hop that failed
    (raised: ``main`` says it in one line)."""
    import nats

    from shared.bus.acks import LingeringAcks
    from shared.bus.replies import _Replies
    from shared.bus.wire import pub_ack

    async def quiet(err: Exception) -> None:  # what ends the role is said once, by ``main``
        pass

    nc = await nats.connect(url, name=f"floor-{name}", error_cb=quiet, max_reconnect_attempts=2, connect_timeout=2)
    tasks: set[asyncio.Task[None]] = set()

    def spawn(coro: Any, label: str) -> None:
        task = asyncio.create_task(coro, name=label)
        tasks.add(task)
        task.add_done_callback(done)

    failed: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()

    def done(task: asyncio.Task[None]) -> None:
        tasks.discard(task)
        error = None if task.cancelled() else task.exception()
        if error is not None and not failed.done():
            failed.set_result(error)

    replies, acks = _Replies(lambda: nc, 5.0), LingeringAcks(lambda: nc, spawn)
    pads = {
        n: b"x" * n for plan in PLANS.values() for groups in plan.values() for g in groups for n in g if n != HAND_OFF
    }
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
                sent = []
                for n in group:
                    seq += 1
                    subject, payload = (
                        (f"floor.{RING[name]}", out) if n == HAND_OFF else (f"floorstore.{name}.{seq}", pads[n])
                    )
                    sent.append(await replies.send(subject, payload, {"Nats-Msg-Id": f"{name}-{os.getpid()}-{seq}"}))
                for _, fut in sent:  # every PubAck in and read, as the bus reads it (an error or a timeout raises)
                    pub_ack(await fut)
        await acks.ack(msg)

    received = 0
    pull = f"$JS.API.CONSUMER.MSG.NEXT.{STREAM}.{CONSUMES[name]}"
    inbox = nc.new_inbox()

    async def ask() -> None:  # one pull for many messages, asked again before it runs dry or expires (a service
        # asks for its free slots, for 5 s, and again as they free: 0.07 pulls a step at one run; the floor fewer)
        await nc.publish(pull, json.dumps({"batch": BATCH, "expires": int(30e9)}).encode(), reply=inbox)

    async def on_msg(msg: Any) -> None:
        nonlocal received
        if not msg.reply:  # a pull's status (expired, heartbeat)
            return
        received += 1
        if received % (BATCH // 2) == 0:
            await ask()
        spawn(handle(msg), "hop")

    await nc.subscribe(inbox, cb=on_msg)
    parent = os.getppid()
    try:
        while os.getppid() == parent:  # a role outlives no benchmark, however it ended
            await ask()
            for _ in range(25):
                if failed.done():
                    raise failed.result()
                await asyncio.sleep(1)
                if os.getppid() != parent:
                    break
    finally:
        replies.close()
        await nc.close()


# --- the coordinator ---------------------------------------------------------------------------------------
@dataclass
class Floor:
    """A nats-server and the three role processes. ``ring`` sends runs round them and says ms per step, keeping
    each ring's CPU seconds by process (nats-server and each role) under a tag; ``contenders`` are the shapes as
    the side-by-side calls them (tag "side"); ``cpu_per_step`` subtracts a shorter ring's CPU from a longer's."""

    stack: LocalStack = field(default_factory=lambda: _stack())  # defined below: looked up when a Floor is made
    roles: list[asyncio.subprocess.Process] = field(default_factory=list)
    rings: dict[tuple[str, str, int, int], list[dict[str, float]]] = field(default_factory=dict)
    nc: NatsClient | None = None

    async def start(self) -> None:
        import nats
        from nats.js.api import AckPolicy, ConsumerConfig, StorageType, StreamConfig

        url = await asyncio.to_thread(self.stack.start_nats)
        self.nc = await nats.connect(url)
        js = self.nc.jetstream()
        await js.add_stream(StreamConfig(name=STREAM, subjects=[f"floor.{s}" for s in RING.values()],
                                         storage=StorageType.FILE))  # fmt: skip
        await js.add_stream(StreamConfig(name=STORE, subjects=["floorstore.>"], storage=StorageType.FILE))
        for subject in CONSUMES.values():
            cfg = ConsumerConfig(durable_name=subject, filter_subject=f"floor.{subject}", ack_policy=AckPolicy.EXPLICIT,
                                 ack_wait=30, max_ack_pending=BATCH)  # fmt: skip
            await js.add_consumer(STREAM, cfg)
        env = {**os.environ, "PYTHONPATH": ROOT}
        for name in RING:
            self.roles.append(
                await asyncio.create_subprocess_exec(sys.executable, "-m", "bench.bus_floor", name, url, env=env)
            )
        await self.ring("floor_handoffs", 1, 3, tag="warm-up")  # every role is up and pulling once it came round

    def cpu_s(self) -> dict[str, float]:
        """CPU seconds so far of nats-server and each role."""
        from bench.throughput import sched_cpu_s

        pids = {p.name: p.popen.pid for p in self.stack.procs} | {
            n: r.pid for n, r in zip(RING, self.roles, strict=True)
        }
        return {name: sched_cpu_s(pid) for name, pid in pids.items()}

    async def ring(self, shape: str, runs: int, steps: int, tag: str = "side") -> float:
        """``runs`` runs of ``steps`` steps round the ring at once: ms per step (their wall time / all steps)."""
        assert self.nc is not None, "start() first"
        ids = [uuid.uuid4().hex for _ in range(runs)]
        left, finished = set(ids), asyncio.Event()

        async def on_done(msg: Any) -> None:
            left.discard(msg.subject.rsplit(".", 1)[1])
            if not left:
                finished.set()

        sub = await self.nc.subscribe("floor.done.*", cb=on_done)
        js = self.nc.jetstream()
        cpu0 = self.cpu_s()
        t0 = time.perf_counter()
        starts = [json.dumps({"run": i, "left": steps, "shape": shape}).encode() for i in ids]
        try:
            await asyncio.gather(*(js.publish("floor.outcome", start) for start in starts))
            while not finished.is_set():  # a role that exited is said at once, not after the bound
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(finished.wait(), 1)
                gone = {n: r.returncode for n, r in zip(RING, self.roles, strict=True) if r.returncode is not None}
                if gone or time.perf_counter() - t0 > 120:
                    raise RuntimeError(
                        f"bus floor: {shape}, {runs} run(s) of {steps} steps not round after "
                        f"{time.perf_counter() - t0:.0f} s (roles exited: {gone or 'none'})"
                    )
        finally:
            await sub.unsubscribe()
        wall = time.perf_counter() - t0
        cpu1 = self.cpu_s()
        self.rings.setdefault((tag, shape, runs, steps), []).append({n: v - cpu0[n] for n, v in cpu1.items()})
        return wall / (runs * steps) * 1000

    def contenders(self) -> dict[str, Contender]:
        """Each shape as a side-by-side contender: (runs at once, steps per run) -> ms per step."""
        return {shape: functools.partial(self.ring, shape) for shape in SHAPES}

    def cpu_per_step(self, tag: str, shape: str, runs: int, short: int, long: int) -> dict[str, float]:
        """CPU ms per step by process of the rings of ``shape`` under ``tag`` (``cpu_between``)."""
        shorts, longs = self.rings.get((tag, shape, runs, short), []), self.rings.get((tag, shape, runs, long), [])
        return cpu_between(shorts, longs, runs, short, long)

    async def stop(self) -> None:
        """The roles, then the server; the server and its state go whatever happened before (a role that
        exited, an interrupt while waiting for one)."""
        try:
            for r in self.roles:
                with contextlib.suppress(ProcessLookupError):  # one that exited already
                    r.terminate()
            for r in self.roles:
                try:
                    await asyncio.wait_for(r.wait(), 5)
                except TimeoutError:
                    with contextlib.suppress(ProcessLookupError):
                        r.kill()
            if self.nc is not None:
                await self.nc.close()
        finally:
            self.stack.stop()
            shutil.rmtree(self.stack.state_dir, ignore_errors=True)


def cpu_between(
    shorts: list[dict[str, float]], longs: list[dict[str, float]], runs: int, short: int, long: int
) -> dict[str, float]:
    """CPU ms per step by process, from the CPU seconds of batches of ``runs`` runs: each batch of ``long`` steps
    less the batch of ``short`` steps of the same round (the n-th of each), per step between them, so the runs'
    starts and ends cancel out; the median over the rounds. Loopwarden's side of the side-by-side the same way."""
    per = [
        {p: (b[p] - a[p]) / (runs * (long - short)) * 1000 for p in b}
        for a, b in zip(shorts, longs, strict=True)  # one of each a round
    ]
    return {p: statistics.median(x[p] for x in per) for p in per[0]} if per else {}


def _stack() -> LocalStack:
    import tempfile

    from loopwarden.stack import LocalStack

    return LocalStack(state_dir=Path(tempfile.mkdtemp(prefix="lw-floor-")))


def main(argv: list[str]) -> int:
    """A role's process: ``python -m bench.bus_floor ROLE NATS_URL`` (``Floor.start`` runs three)."""
    if len(argv) != 2 or argv[0] not in RING:
        print(f"usage: python -m bench.bus_floor {{{','.join(RING)}}} NATS_URL (got {argv})", file=sys.stderr)
        return 2
    import uvloop

    try:
        uvloop.run(role(argv[0], argv[1]))
    except KeyboardInterrupt:
        pass
    except Exception as err:  # the server gone or never there, a hop that failed: one line, the role named
        print(f"bus floor {argv[0]} at {argv[1]}: {err!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
