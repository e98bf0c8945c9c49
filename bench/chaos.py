"""Chaos: concurrent runs, some moving money with a non-idempotent tool, while random replicas
of every service are SIGKILLed and restarted. Counts what must stay zero.

``python -m bench --only chaos`` is the long form (80 runs, 30 kills); the test suite runs a
short form (``tests/own/test_chaos.py``). A run is *lost* if it has no state, *doubled* if its
one ``transfer_funds`` call charged more than once, *stuck* if it is neither finished nor
waiting for a human with an open escalation: all three must be 0.
"""

from __future__ import annotations

import asyncio
import random
import signal
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from loopwarden.client import Client, new_run_id
from loopwarden.stack import LocalStack, Proc
from shared import subjects as S
from shared.messages import Escalation
from shared.scenario import parse_scenario
from shared.settings import Settings
from tests.support.payments import count_charges

ROOT = Path(__file__).resolve().parents[1]
TOOLS_DIR = ROOT / "tests" / "tools"
REPLICAS = ("planner", "planner", "executor", "executor", "validator", "validator", "judge", "governor", "escalation")
FINISHED = ("completed", "stopped", "failed")


def scenario(i: int) -> dict[str, Any]:
    """Every third run pays once (not idempotent), every third syncs a ledger (idempotent)."""
    kind = ("pay", "sync", "calc")[i % 3]
    steps: list[dict[str, Any]] = [{"tool_calls": [{"name": "calculator", "input": {"expression": f"{i}+1"}}]}]
    if kind != "calc":
        tool = "transfer_funds" if kind == "pay" else "sync_ledger"
        args = {"customer_id": f"cus_chaos{i:04d}", "amount_cents": 100 + i, "currency": "eur"}
        steps.append({"tool_calls": [{"name": tool, "id": "toolu_money", "input": args}]})
    steps.append({"tool_calls": [{"name": "calculator", "input": {"expression": f"{i}*2"}}]})
    steps.append({"tool_calls": [{"name": "submit_result", "input": {"answer": f"done {i}"}}]})
    return {"name": f"chaos-{kind}-{i}", "task": "Work, then submit.", "planner": steps}


@dataclass
class ChaosResult:
    runs: int = 0
    completed: int = 0
    escalated: int = 0  # waiting for a human, with the escalation in the queue
    lost: list[str] = field(default_factory=list)
    stuck: dict[str, str] = field(default_factory=dict)
    doubled: dict[str, int] = field(default_factory=dict)
    charged_once: int = 0
    unknown_outcomes: int = 0
    payments_failed: int = 0  # the tool failed (an event says so) and the run went on without it
    kills: Counter[str] = field(default_factory=Counter)
    dead_letters: list[str] = field(default_factory=list)  # a kill is a crash, never a reason to give up on a message
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not (self.lost or self.stuck or self.doubled or self.dead_letters)


async def charges(client: Client, run_id: str) -> int:
    return await count_charges(client.bus.js, run_id)


async def failed_visibly(client: Client, run_id: str, tool: str) -> bool:
    """A failure event of ``tool`` is in the run's history (the model and subscribers saw it)."""
    events = await client.events(run_id, subjects=f"{S.FAILURE_PREFIX}.>")
    return any(e.kind.endswith(f".{tool}") for e in events)


async def open_escalations(client: Client, run_id: str, within_s: float = 30.0) -> list[Escalation]:
    """The run's open escalations; asked again while no escalation replica answers (the last one
    killed is still starting: a request then has no responders)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return (await client.escalations(run_id=run_id)).escalations
        except (NoRespondersError, NatsTimeoutError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def killer(stack: LocalStack, kills: int, interval: float, rng: random.Random, result: ChaosResult) -> None:
    """SIGKILL a random replica, start its replacement (same label: its log is appended), repeat.
    The services are visited in shuffled rounds so that every one of them is killed."""
    order: list[str] = []
    for _ in range(kills):
        await asyncio.sleep(interval * rng.uniform(0.5, 1.5))
        if not order:
            order = sorted(set(REPLICAS))
            rng.shuffle(order)
        service = order.pop()
        victims = [p for p in stack.procs if p.service == service and p.popen.poll() is None]
        if not victims:
            continue
        victim: Proc = rng.choice(victims)
        victim.popen.send_signal(signal.SIGKILL)
        await asyncio.to_thread(victim.popen.wait)
        stack.procs.remove(victim)
        stack.start_service(service, label=victim.name)
        result.kills[service] += 1


async def drive(
    stack: LocalStack, settings: Settings, runs: int, kills: int, interval: float, seed: int, timeout: float
) -> ChaosResult:
    rng = random.Random(seed)
    result = ChaosResult(runs=runs)
    started = time.monotonic()
    async with Client(settings) as client:
        plans = {new_run_id(): scenario(i) for i in range(runs)}
        chaos = asyncio.create_task(killer(stack, kills, interval, rng, result))
        for run_id, plan in plans.items():  # submitted over the first part of the chaos
            await client.submit_scenario(parse_scenario(plan), run_id=run_id)
            await asyncio.sleep(rng.uniform(0, interval / 2))
        await chaos
        until = (*FINISHED, "awaiting_human")
        deadline = time.monotonic() + timeout
        for run_id, plan in plans.items():
            state = None
            try:
                state = await client.wait(run_id, timeout=max(1.0, deadline - time.monotonic()), until=until)
            except TimeoutError:
                state = await client.state(run_id)
            if state is None:
                result.lost.append(run_id)
                continue
            paid = await charges(client, run_id)
            if plan["name"].startswith("chaos-pay"):
                if paid > 1:
                    result.doubled[run_id] = paid
                elif paid == 1:
                    result.charged_once += 1
            if state.status == "completed":
                result.completed += 1
                if plan["name"].startswith("chaos-pay") and paid == 0:
                    if await failed_visibly(client, run_id, "transfer_funds"):
                        result.payments_failed += 1  # the model was told; nothing silently lost
                    else:
                        result.lost.append(run_id)  # completed, yet the payment never happened
            elif state.status == "awaiting_human":
                open_items = await open_escalations(client, run_id)
                if open_items:
                    result.escalated += 1
                    result.unknown_outcomes += sum(1 for e in open_items if e.kind == "unknown_outcome")
                else:
                    result.stuck[run_id] = "awaiting a human, but nothing in the queue"
            elif state.status not in FINISHED:
                result.stuck[run_id] = f"{state.status} (iteration {state.iteration.n})"
            else:
                result.stuck[run_id] = f"{state.status}: {state.final_reason}"
        result.dead_letters = [f"{d.service} {d.subject}: {d.reason}" for d in await client.dead_letters()]
    result.seconds = time.monotonic() - started
    return result


def run_chaos(
    runs: int, kills: int, interval: float, seed: int, timeout: float, state_dir: Path | None = None
) -> ChaosResult:
    env = {
        "LW_TOOL_CONTRACT_DIR": str(TOOLS_DIR),
        "LW_ACK_WAIT_S": "3",
        "LW_MAX_DELIVER": "5",
        "LW_REDELIVER_DELAY_S": "0.2",
        "LW_LOG_LEVEL": "INFO",
    }
    stack = LocalStack(
        state_dir=state_dir or Path(tempfile.mkdtemp(prefix="lw-chaos-")),
        env=env,
        services=REPLICAS,
    )
    stack.start()
    try:
        return asyncio.run(drive(stack, Settings(nats_url=stack.nats_url), runs, kills, interval, seed, timeout))
    finally:
        stack.stop()


def run(runs: int = 80, kills: int = 30, seed: int = 7) -> ChaosResult:
    return run_chaos(runs=runs, kills=kills, interval=0.6, seed=seed, timeout=180)


def report(r: ChaosResult) -> list[str]:
    kills = ", ".join(f"{s} {n}" for s, n in sorted(r.kills.items()))
    return [
        f"chaos: {r.runs} concurrent runs, {sum(r.kills.values())} SIGKILLs of random replicas ({kills}), "
        f"{r.seconds:.0f} s:",
        f"  completed {r.completed}   escalated to a human {r.escalated} (unknown outcome {r.unknown_outcomes})",
        f"  lost {len(r.lost)}   doubled {len(r.doubled)}   stuck {len(r.stuck)}   "
        f"payments charged exactly once {r.charged_once}, failed visibly {r.payments_failed}   "
        f"dead-lettered {len(r.dead_letters)}",
        *(f"  LOST {run_id}" for run_id in r.lost),
        *(f"  DOUBLED {run_id}: {n} charges" for run_id, n in r.doubled.items()),
        *(f"  STUCK {run_id}: {why}" for run_id, why in r.stuck.items()),
        *(f"  DEAD-LETTERED {letter}" for letter in r.dead_letters),
    ]
