"""A dead letter handed back (`loopwarden dlq requeue N`): the service that gave up on it runs it again, as a
redelivery, and the run it belonged to goes on; nothing appears twice in the run's history.

Real nats-server, real service processes, the real CLI. Both letters are made the way production makes them:
a dependency (the governor) gone for longer than every delivery of the message (`LW_ACK_WAIT_S=1`,
`LW_MAX_DELIVER=2`), so the planner gives up on a command (the run's first turn) or on an event it consumed
(a tool's outcome, whose handler takes the next turn)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from loopwarden.client import Client, Event, NumberedLetter
from loopwarden.stack import LocalStack
from shared import subjects as S
from shared.messages import BudgetRequest, Requeue, RunSnapshot, SectionTokens, Usage
from shared.scenario import parse_scenario
from shared.settings import Settings
from shared.telemetry import Telemetry
from tests.support.otlp_collector import OtlpCollector
from tests.support.paths import ROOT
from tests.support.stacks import TEST_ENV
from tests.support.timing import bound, eventually, polls
from tests.support.tracing import spans_of_run

GIVES_UP_FAST = {**TEST_ENV, "LW_ACK_WAIT_S": "1", "LW_MAX_DELIVER": "2"}


def cli(nats_url: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    drop = ("NATS_URL", "LW_NATS_URL", "ANTHROPIC_API_KEY", "LW_STATE_DIR", "LW_NATS_USER", "LW_NATS_PASSWORD")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(LW_NATS_URL=nats_url, LW_STATE_DIR=str(tmp_path / "cli-state"))
    return subprocess.run(
        [sys.executable, "-m", "loopwarden.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=bound(60),
    )


async def run_cli(nats_url: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(cli, nats_url, tmp_path, *args)


async def letters_of(client: Client, run_id: str, count: int = 1, timeout: float = bound(30.0)) -> list[NumberedLetter]:
    found: list[NumberedLetter] = []
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        found = [n for n in await client.letters() if run_id in n.letter.body]
        if len(found) >= count:
            break
        await asyncio.sleep(0.25)
    return found


async def stalled_on(client: Client, run_id: str, seq: int) -> RunSnapshot:
    """The run's record once it says it is stalled on letter ``seq``."""

    async def stalled() -> RunSnapshot | None:
        state = await client.state(run_id)
        return state if state is not None and state.stall is not None and seq in state.stall.letters else None

    state = await eventually(stalled, what=f"run {run_id} stalled on letter {seq}", within=bound(15))
    assert state.status == "stalled", state.status
    return state


def duplicated(events: list[Event]) -> list[str]:
    """Events stored more than once (same subject, same body)."""
    seen = Counter((e.subject, json.dumps(e.payload, sort_keys=True)) for e in events)
    return [subject for (subject, _), n in seen.items() if n > 1]


async def test_a_turn_dead_lettered_while_the_governor_was_gone_completes_once_it_is_requeued(
    tmp_path: Path, otlp: OtlpCollector, client_telemetry: Telemetry
) -> None:
    """No governor: the run's first turn (a `run.advance` command) is dead-lettered by the planner with its
    reason. The governor starts; `loopwarden dlq` names the letter's number; `loopwarden dlq requeue N` hands it
    back; the run completes, with each event once, and the turn taken now is in the run's trace although the
    CLI traces nothing. Requeuing it again within the de-duplication window runs nothing more; a request/reply
    letter and an unknown number are one-line refusals (exit 1); a requeue naming another service's letter, or
    no letter, runs nothing."""
    env = {**GIVES_UP_FAST, "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint}
    stack = LocalStack(state_dir=tmp_path, env=env, services=("planner", "executor", "validator"))
    stack.start()
    url = str(stack.nats_url)
    try:
        async with Client(Settings(nats_url=url), telemetry=client_telemetry) as client:
            scenario = {"name": "governor-gone", "task": "Say done.", "planner": [{"text": "done"}]}
            run_id = await client.submit_scenario(parse_scenario({**scenario, "answer_mode": "text"}))
            (numbered,) = await letters_of(client, run_id)
            letter = numbered.letter
            assert letter.service == "planner" and letter.subject == S.RUN_ADVANCE, letter
            assert "still not ready after 2 deliveries" in letter.reason and "governor" in letter.reason
            # not left `running`: stalled on the letter, which the record names (tests/locked/test_stalled.py)
            stalled = await stalled_on(client, run_id, numbered.seq)
            assert stalled.stall is not None and "governor" in stalled.stall.reason

            # the operator's view: every letter with its number, in text and JSON
            listed = await run_cli(url, tmp_path, "dlq", "--json")
            assert listed.returncode == 0, listed.stderr
            assert {"seq": numbered.seq, "subject": S.RUN_ADVANCE} in [
                {"seq": d["seq"], "subject": d["subject"]} for d in json.loads(listed.stdout)
            ]
            text = (await run_cli(url, tmp_path, "dlq")).stdout
            assert f"{numbered.seq:>5}  " in text and "dlq requeue N" in text, text

            stack.wait_ready([stack.start_service("governor")])
            requeued = await run_cli(url, tmp_path, "dlq", "requeue", str(numbered.seq))
            assert requeued.returncode == 0, requeued.stdout + requeued.stderr
            assert f"letter {numbered.seq} handed back to planner" in requeued.stdout
            state = await client.wait(run_id, timeout=bound(30))
            assert state.status == "completed" and state.final_output == "done", state.final_reason

            events = await client.events(run_id)
            kinds = Counter(e.kind for e in events)
            assert kinds["run.started"] == 1 and kinds["run.model_called"] == 1 and kinds["run.completed"] == 1
            assert duplicated(events) == [], duplicated(events)
            # the model call could only happen after the requeue (no budget before): it is in the run's trace
            await spans_of_run(otlp, client, run_id, {"loopwarden-planner"})
            root = next(s for s in otlp.spans if s.name == f"run {run_id}")
            for _ in range(polls(100)):
                if any(s.name.startswith("chat ") for s in otlp.trace(root.trace_id)):
                    break
                await asyncio.sleep(0.1)
            assert any(s.name.startswith("chat ") for s in otlp.trace(root.trace_id)), otlp.trace(root.trace_id)

            again = await run_cli(url, tmp_path, "dlq", "requeue", str(numbered.seq))
            assert again.returncode == 1 and "already" in again.stderr, again.stdout + again.stderr  # not sent
            assert "nothing was sent" in again.stderr
            await asyncio.sleep(bound(1.0))
            assert Counter(e.kind for e in await client.events(run_id)) == kinds
            assert [n for n in await letters_of(client, run_id, count=2, timeout=bound(1))] == [numbered]  # not again

            # a requeue names a letter; the service reads it itself and runs only its own: the planner's letter
            # sent to the executor, and a number that is no letter, run nothing and are letters with the reason
            await client.bus.publish(
                S.requeue("executor", "calculator"), Requeue(letter=numbered.seq), msg_id="forged-1"
            )
            await client.bus.publish(S.requeue("planner"), Requeue(letter=999999), msg_id="forged-2")
            refused_requeues: list[str] = []
            for _ in range(polls(80)):
                subjects = (S.requeue("executor", "calculator"), S.requeue("planner"))
                refused_requeues = [n.letter.reason for n in await client.letters() if n.letter.subject in subjects]
                if len(refused_requeues) == 2:
                    break
                await asyncio.sleep(0.25)
            assert sorted(refused_requeues) == [
                f"not requeued: letter {numbered.seq} was dead-lettered by planner "
                f"(on {S.dead_letter('planner')}), not by executor",
                "not requeued: no dead letter numbered 999999 in LW_DLQ",
            ], refused_requeues
            assert Counter(e.kind for e in await client.events(run_id)) == kinds

            # a request whose handler failed is a letter too, but its caller is gone: not requeued, said why (the
            # governor cannot read this run's ledger; a malformed request is answered and not dead-lettered)
            ledger = f"ledger-{run_id}"
            await (await client.bus.kv(S.KV_BUDGETS)).put(S.kv_key(ledger), b"{not a budget ledger")
            budget = BudgetRequest(
                run_id=ledger,
                turn=1,
                model="m",
                sections=SectionTokens(),
                spent=Usage(),
                context_budget_tokens=1000,
                run_token_budget=1000,
                cost_ceiling_usd=1.0,
            )
            await client.bus.nc.request(S.BUDGET_RESERVE, budget.model_dump_json().encode(), timeout=bound(5))
            request = [n for n in await client.letters() if n.letter.subject == S.BUDGET_RESERVE]
            for _ in range(polls(20)):
                if request:
                    break
                await asyncio.sleep(0.25)
                request = [n for n in await client.letters() if n.letter.subject == S.BUDGET_RESERVE]
            refused = await run_cli(url, tmp_path, "dlq", "requeue", str(request[0].seq))
            assert refused.returncode == 1, refused.stdout + refused.stderr
            assert f"letter {request[0].seq} is a request on {S.BUDGET_RESERVE}" in refused.stderr
            unknown = await run_cli(url, tmp_path, "dlq", "requeue", str(numbered.seq), "999999")
            assert unknown.returncode == 1, unknown.stdout + unknown.stderr
            # the first letter that cannot be: handed back already (its claim in lw_requeues), then 999999
            assert f"letter {numbered.seq} was handed back to planner already" in unknown.stderr
            assert unknown.stderr.strip().endswith("nothing was requeued")
            unknown = await run_cli(url, tmp_path, "dlq", "requeue", "999999")
            assert "no dead letter numbered 999999 in LW_DLQ" in unknown.stderr and unknown.returncode == 1
            for done in (refused, unknown):
                assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr
                assert done.stdout == ""  # checked before any was sent
    finally:
        stack.stop()


async def test_an_event_the_planner_gave_up_on_is_handed_back_without_a_second_copy_in_the_history(
    tmp_path: Path,
) -> None:
    """The governor dies while the run's tool call runs: the call's outcome (`tool.succeeded.calculator`, an
    event on LW_EVT) reaches the planner, whose handler takes the next turn and cannot get a budget decision,
    so the planner dead-letters the event. Requeued through the client once the governor is back, the planner
    applies it as a redelivery and the run completes; the event is in the run's history once, not republished."""
    services = ("planner", "executor", "validator", "governor")
    stack = LocalStack(state_dir=tmp_path, env=GIVES_UP_FAST, services=services)
    stack.start()
    try:
        async with Client(Settings(nats_url=stack.nats_url)) as client:
            scenario = {
                "name": "outcome-given-up",
                "task": "Compute, then say done.",
                "planner": [{"tool_calls": [{"name": "calculator", "input": {"expression": "6*7"}}]}, {"text": "done"}],
                "tools": {"calculator": [{"latency_s": 3.0}]},  # the real tool runs, then takes 3 s more
                "answer_mode": "text",
            }
            run_id = await client.submit_scenario(parse_scenario(scenario))
            for _ in range(polls(200)):  # the first turn is taken (its budget decided): the governor goes away
                if any(e.kind == "run.model_called" for e in await client.events(run_id, timeout=bound(0.2))):
                    break
                await asyncio.sleep(0.05)
            governor = next(p for p in stack.procs if p.service == "governor")
            os.kill(governor.popen.pid, signal.SIGKILL)
            governor.popen.wait()

            (numbered,) = await letters_of(client, run_id)
            letter = numbered.letter
            assert letter.service == "planner", letter
            assert letter.subject == f"{S.tool_succeeded('calculator')}.{run_id}", letter.subject
            assert "governor did not answer" in letter.reason, letter.reason
            await stalled_on(client, run_id, numbered.seq)

            stack.wait_ready([stack.start_service("governor", label="governor-again")])
            requeued = await client.requeue(numbered.seq)
            assert (requeued.service, requeued.subject, requeued.duplicate) == ("planner", letter.subject, False)
            state = await client.wait(run_id, timeout=bound(30))
            assert state.status == "completed" and state.final_output == "done", state.final_reason

            events = await client.events(run_id)
            kinds = Counter(e.kind for e in events)
            assert kinds["tool.succeeded.calculator"] == 1, kinds  # handed to the planner, not republished
            assert kinds["run.model_called"] == 2 and kinds["run.completed"] == 1, kinds
            assert duplicated(events) == [], duplicated(events)
            assert [n.seq for n in await letters_of(client, run_id, count=2, timeout=bound(1))] == [numbered.seq]
    finally:
        stack.stop()
