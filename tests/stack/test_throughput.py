"""Many runs in flight on one replica of each service, nothing lost when a busy replica dies,
and every message that cannot be delivered ends in the DLQ with its reason."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from loopwarden.client import Client
from loopwarden.stack import LocalStack
from shared import subjects as S
from shared.bus import RequestRefused
from shared.messages import BudgetDecision, DeadLetter, ErrorReply, RunAdvance
from shared.scenario import parse_scenario
from tests.support.stacks import TEST_ENV
from tests.support.timing import bound, eventually

ROOT = Path(__file__).resolve().parents[2]
MODEL_S, TOOL_S, JUDGE_S = 1.0, 3.5, 1.0  # the tool outlasts LW_ACK_WAIT_S=3: only heartbeats keep it


def slow_run(i: int, model_s: float = MODEL_S, tool_s: float = TOOL_S, judge_s: float = JUDGE_S) -> dict[str, Any]:
    """Two slow model turns around one slow tool call, then a slow judge."""
    return {
        "name": f"slow-{i}",
        "task": f"What is {i} times 2?",
        "planner": [
            {"latency_s": model_s, "tool_calls": [{"name": "calculator", "input": {"expression": f"{i}*2"}}]},
            {"latency_s": model_s, "text": f"{i} times 2 is {i * 2}."},
        ],
        "tools": {"calculator": [{"latency_s": tool_s}]},
        "judge": [{"latency_s": judge_s, "scores": {"correct": 1.0}}],
        "rubric": {"threshold": 0.5, "criteria": [{"name": "correct"}]},
        "answer_mode": "text",
    }


async def test_concurrent_slow_runs_overlap_on_one_replica_of_each_service(one_client: Client) -> None:
    k = 8
    per_run = 2 * MODEL_S + TOOL_S + JUDGE_S
    runs = [parse_scenario(slow_run(i)) for i in range(k)]
    t0 = time.monotonic()
    ids = await asyncio.gather(*(one_client.submit_scenario(sc) for sc in runs))
    states = await asyncio.gather(*(one_client.wait(rid, timeout=bound(120)) for rid in ids))
    wall = time.monotonic() - t0
    for i, state in enumerate(states):
        assert state.status == "completed", state.final_reason
        assert state.final_output == f"{i} times 2 is {i * 2}."
        assert state.judge_seq == 1 and state.model_calls == 2  # every slow step really ran
    # One at a time they would take k x per_run; overlapped, little more than one run.
    assert wall < 0.3 * k * per_run, f"{k} runs took {wall:.1f}s; one at a time would be {k * per_run:.0f}s"
    # The tool outlasted the ack wait: heartbeats kept every in-flight call from being redelivered.
    info = await one_client.bus.js.consumer_info(S.STREAM_CMD, "executor_calculator")
    assert info.num_redelivered == 0
    assert info.config.max_ack_pending is not None and info.config.max_ack_pending >= 64


async def test_sigkill_of_an_executor_holding_many_calls_loses_nothing(one_each: LocalStack) -> None:
    from shared.settings import Settings

    k = 10
    async with Client(Settings(nats_url=one_each.nats_url)) as client:
        ids = await asyncio.gather(
            *(client.submit_scenario(parse_scenario(slow_run(100 + i, 0.0, 8.0, 0.0))) for i in range(k))
        )
        held = 0
        for _ in range(int(bound(600))):  # until the executor holds every run's call at once
            info = await client.bus.js.consumer_info(S.STREAM_CMD, "executor_calculator")
            held = info.num_ack_pending or 0
            if held >= k:
                break
            await asyncio.sleep(0.05)
        assert held >= k, f"the executor held {held} calls at once, not {k}"
        executor = next(p for p in one_each.procs if p.service == "executor" and p.popen.poll() is None)
        os.kill(executor.popen.pid, signal.SIGKILL)
        executor.popen.wait()
        replacement = one_each.start_service("executor", label=f"executor-replacement-{time.monotonic_ns()}")
        one_each.wait_ready([replacement])
        for rid in ids:
            state = await client.wait(rid, timeout=bound(90))
            assert state.status == "completed", state.final_reason
            kinds = [e.kind for e in await client.events(rid)]
            assert kinds.count("tool.succeeded.calculator") == 1, kinds
            assert kinds.count("run.completed") == 1


async def test_a_stopped_executor_hands_back_the_calls_it_could_not_finish(one_each: LocalStack) -> None:
    """SIGTERM: in-flight calls get the grace period (LW_ACK_WAIT_S here), the rest are handed back."""
    from shared.settings import Settings

    k = 6
    async with Client(Settings(nats_url=one_each.nats_url)) as client:
        ids = await asyncio.gather(
            *(client.submit_scenario(parse_scenario(slow_run(200 + i, 0.0, 8.0, 0.0))) for i in range(k))
        )
        held = 0
        for _ in range(int(bound(600))):
            held = (await client.bus.js.consumer_info(S.STREAM_CMD, "executor_calculator")).num_ack_pending or 0
            if held >= k:
                break
            await asyncio.sleep(0.05)
        assert held >= k
        executor = next(p for p in one_each.procs if p.service == "executor" and p.popen.poll() is None)
        executor.popen.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(executor.popen.wait, 30) == 0  # a clean exit, without waiting for the tools
        replacement = one_each.start_service("executor", label=f"executor-after-stop-{time.monotonic_ns()}")
        one_each.wait_ready([replacement])
        for rid in ids:
            state = await client.wait(rid, timeout=bound(90))
            assert state.status == "completed", state.final_reason
            kinds = [e.kind for e in await client.events(rid)]
            assert kinds.count("tool.succeeded.calculator") == 1, kinds


# --- every bad message lands in the DLQ with its reason -------------------------------------------


async def letters_where(client: Client, marker: str, timeout: float = bound(15.0)) -> list[DeadLetter]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [d for d in await client.dead_letters() if marker in d.body]
        if found:
            return found
        await asyncio.sleep(0.2)
    return []


async def test_deeply_nested_json_is_dead_lettered_at_once(client: Client) -> None:
    marker = "nested-" + os.urandom(4).hex()
    depth = 100_000
    body = b'{"run_id": "' + marker.encode() + b'", "task": ' + b"[" * depth + b"]" * depth + b"}"
    await client.bus.publish(S.run_submit(), body, msg_id=f"submit.{marker}")
    letters = await letters_where(client, marker)
    assert len(letters) == 1, "a message nested too deeply must be dead-lettered, once"
    letter = letters[0]
    assert letter.service == "planner" and letter.subject == S.run_submit()
    assert "RunSubmit" in letter.reason and letter.deliveries == 1, letter.reason


async def test_a_malformed_request_is_answered_with_the_reason_and_not_dead_lettered(client: Client) -> None:
    """The requester reads why; no letter is written (a request cannot be handed back, and a letter per bad
    request would let any requester push the operators' letters out of the bounded LW_DLQ)."""
    marker = "badreq-" + os.urandom(4).hex()
    resp = await client.bus.nc.request(
        S.BUDGET_RESERVE, f'{{"run_id": "{marker}", "turn": "x"}}'.encode(), timeout=bound(5)
    )
    reply = ErrorReply.model_validate_json(resp.data)  # typed: the planner can read it
    assert reply.ok is False and "BudgetRequest" in reply.error
    assert await letters_where(client, marker, timeout=bound(1.0)) == []

    nested = b'{"run_id": "' + marker.encode() + b'-deep", "sections": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    resp = await client.bus.nc.request(S.BUDGET_RESERVE, nested, timeout=bound(5))
    assert ErrorReply.model_validate_json(resp.data).ok is False
    # The bus helper turns the typed error into an exception the caller handles.
    with pytest.raises(RequestRefused, match="BudgetRequest"):
        await client.bus.request(S.BUDGET_RESERVE, RunAdvance(run_id=marker, iteration=0), BudgetDecision)


async def test_a_handler_that_kills_its_process_on_every_delivery_is_dead_lettered(
    client: Client, stack: LocalStack, tmp_path: Path
) -> None:
    marker = "crash-" + os.urandom(4).hex()
    subject = S.tool_execute(f"test_crash_{marker}")  # any LW_CMD subject no service consumes
    log = tmp_path / "deliveries.log"
    env = {
        **os.environ,
        **TEST_ENV,
        "LW_NATS_URL": str(stack.nats_url),
        "LW_ACK_WAIT_S": "1",
        "LW_MAX_DELIVER": "2",
        "LW_CRASH_SUBJECT": subject,
        "LW_CRASH_LOG": str(log),
    }
    env.pop("NATS_URL", None)
    await client.bus.publish(subject, RunAdvance(run_id=marker, iteration=0), msg_id=marker)
    exits: list[int | None] = []
    letters: list[DeadLetter] = []
    for _ in range(6):  # restart it as a supervisor would, until the message is gone
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.support.crashing_consumer", cwd=ROOT, env=env, stdout=subprocess.DEVNULL
        )
        deadline = time.monotonic() + bound(20)
        while proc.returncode is None and time.monotonic() < deadline and not letters:
            letters = await letters_where(client, marker, timeout=bound(0.5))
        exits.append(proc.returncode)
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()
        if letters:
            break
    assert log.read_text().split() == [marker, marker], "the handler ran exactly max_deliver times"
    assert exits[:2] == [3, 3]
    assert len(letters) == 1 and letters[0].subject == subject and letters[0].deliveries == 3
    assert "not completed after 2 deliveries" in letters[0].reason


@pytest.mark.parametrize(("in_place", "tries_each"), [(True, (2, 3)), (False, (1, 1))])
async def test_a_handler_waiting_for_a_dependency_is_held_for_the_ack_wait_then_dead_lettered_with_why(
    client: Client, stack: LocalStack, in_place: bool, tries_each: tuple[int, int]
) -> None:
    """A handler that spends 0.4 s before saying "try later" (a dependency that times out) is tried
    again in place only until the ack wait (1 s) has passed since its delivery - its own time counted,
    not only the waits between tries - then handed back (at once when it says the wait must not hold
    the message); after the last delivery the message is dead-lettered with what it waited for, not as
    a crashed handler."""
    from shared.bus import Bus, TryLater, current_deliveries
    from shared.settings import Settings

    marker = "later-" + os.urandom(4).hex()
    subject = S.tool_execute(f"test_later_{marker}")
    bus = Bus(Settings(nats_url=str(stack.nats_url), ack_wait_s=1, max_deliver=2), "latertest")
    tries: list[int] = []

    @bus.consumer(durable=f"latertest_{marker}", filter_subjects=[subject], model=RunAdvance)
    async def on_event(ev: RunAdvance) -> None:
        tries.append(current_deliveries())
        await asyncio.sleep(0.4)
        raise TryLater("the dependency did not answer", delay=0.05, in_place=in_place)

    await bus.connect()
    try:
        await bus.publish(subject, RunAdvance(run_id=marker, iteration=0), msg_id=marker)
        await bus.start()
        letters = await letters_where(client, marker, timeout=bound(30))
    finally:
        await bus.stop()
    # 2 deliveries of at most 3 tries each (0.4 s + 0.05 s a try within 1 s); the waits alone would allow 20 each
    assert 2 * tries_each[0] <= len(tries) <= 2 * tries_each[1], tries
    assert tries[0] == 1 and tries[1] == 2, tries  # a try in place sees itself as taken again, as a redelivery does
    assert len(letters) == 1 and letters[0].service == "latertest" and letters[0].deliveries == 2, letters
    assert letters[0].reason.startswith("still not ready after 2 deliveries"), letters[0].reason
    assert "the dependency did not answer" in letters[0].reason


async def test_a_handler_waiting_on_a_replica_that_shows_it_is_alive_is_held_past_every_delivery(
    client: Client, stack: LocalStack
) -> None:
    """A redelivered tool command whose call another replica is running (its lease renewed) waits for that
    replica, however long the call runs: ``TryLater(while_alive=True)`` holds the message past the ack wait
    without spending a delivery. Here the wait lasts 4 s, four ack waits of 1 s and twice what 2 deliveries
    would hold; the handler then succeeds on the first delivery and nothing is dead-lettered."""
    from shared.bus import Bus, TryLater, current_deliveries
    from shared.settings import Settings

    marker = "alive-" + os.urandom(4).hex()
    subject = S.tool_execute(f"test_alive_{marker}")
    bus = Bus(Settings(nats_url=str(stack.nats_url), ack_wait_s=1, max_deliver=2), "alivetest")
    tries: list[int] = []
    done = asyncio.Event()
    started = 0.0

    @bus.consumer(durable=f"alivetest_{marker}", filter_subjects=[subject], model=RunAdvance)
    async def on_event(ev: RunAdvance) -> None:
        nonlocal started
        started = started or time.monotonic()
        tries.append(current_deliveries())
        if time.monotonic() - started < 4.0:
            raise TryLater("replica-b is running it", delay=0.5, while_alive=True)
        done.set()

    await bus.connect()
    try:
        await bus.publish(subject, RunAdvance(run_id=marker, iteration=0), msg_id=marker)
        await bus.start()
        await asyncio.wait_for(done.wait(), timeout=bound(30))
        await asyncio.sleep(bound(0.5))  # the ack is sent
        info = await bus.js.consumer_info(S.stream_for(subject) or S.STREAM_CMD, f"alivetest_{marker}")
    finally:
        await bus.stop()
    assert info.num_redelivered == 0 and info.num_ack_pending == 0, info
    assert len(tries) >= 8, tries  # tried in place every 0.5 s for 4 s, all within the first delivery
    assert [d for d in await client.dead_letters() if marker in d.body] == []


async def test_a_replica_whose_event_loop_stalls_past_half_the_ack_wait_says_so(
    stack: LocalStack, caplog: pytest.LogCaptureFixture
) -> None:
    """A handler that blocks the event loop (CPU-bound code, a starved process) stops the heartbeats: the
    replica logs how late they were and that its messages may come back, so a redelivery has a reason."""
    from shared.bus import Bus
    from shared.settings import Settings

    marker = "stall-" + os.urandom(4).hex()
    subject = S.tool_execute(f"test_stall_{marker}")
    bus = Bus(Settings(nats_url=str(stack.nats_url), ack_wait_s=1), "stalltest")
    done = asyncio.Event()

    @bus.consumer(durable=f"stalltest_{marker}", filter_subjects=[subject], model=RunAdvance)
    async def on_event(ev: RunAdvance) -> None:
        time.sleep(1.2)  # noqa: ASYNC251 (the point: it blocks the loop, no heartbeat can go out meanwhile)
        done.set()

    await bus.connect()
    try:
        await bus.publish(subject, RunAdvance(run_id=marker, iteration=0), msg_id=marker)
        with caplog.at_level("WARNING", logger="loopwarden.bus"):
            await bus.start()
            await asyncio.wait_for(done.wait(), timeout=bound(30))
            await asyncio.sleep(bound(0.5))
    finally:
        await bus.stop()
    late = [r.getMessage() for r in caplog.records if "heartbeats" in r.getMessage()]
    assert late and late[0].startswith("stalltest: heartbeats ") and "LW_ACK_WAIT_S (1s)" in late[0], late


async def test_a_replica_that_is_stopping_takes_no_new_message_so_none_bounces_through_its_deliveries(
    stack: LocalStack,
) -> None:
    """Replica A is stopping (an in-flight handler keeps it in its grace period) while 30 messages arrive;
    replica B, healthy, handles them all on their first delivery. A stopping replica used to keep its pull
    requests open and hand back at once what they brought, each bounce a delivery: in a rolling upgrade a
    run's ``tool.succeeded`` came to the new replica on its sixth delivery and was dead-lettered as crashing."""
    from shared.bus import Bus, current_deliveries
    from shared.settings import Settings

    marker = "stopping-" + os.urandom(4).hex()
    subject = S.tool_execute(f"test_stopping_{marker}")
    durable = f"stoppingtest_{marker}"
    settings = Settings(nats_url=str(stack.nats_url), ack_wait_s=3, max_deliver=5)
    a, b = Bus(settings, "stoppingtest"), Bus(settings, "stoppingtest")
    busy = asyncio.Event()
    seen: dict[str, int] = {}

    @a.consumer(durable=durable, filter_subjects=[subject], model=RunAdvance)
    async def on_a(ev: RunAdvance) -> None:
        if ev.run_id.endswith("-slow"):
            busy.set()
            await asyncio.sleep(2.5)  # in flight while A stops: A stays in its grace period
            return
        seen[ev.run_id] = current_deliveries()

    @b.consumer(durable=durable, filter_subjects=[subject], model=RunAdvance)
    async def on_b(ev: RunAdvance) -> None:
        seen[ev.run_id] = current_deliveries()

    await a.connect()
    await b.connect()
    try:
        await a.start()
        await a.publish(subject, RunAdvance(run_id=f"{marker}-slow", iteration=0), msg_id=f"{marker}-slow")
        await asyncio.wait_for(busy.wait(), timeout=bound(10))
        stopping = asyncio.create_task(a.stop())
        await asyncio.sleep(0.2)
        await b.start()
        names = [f"{marker}-{i}" for i in range(30)]
        for name in names:
            await a.publish(subject, RunAdvance(run_id=name, iteration=0), msg_id=name)
        await eventually(lambda: set(names) <= set(seen), what="all 30 messages handled", within=bound(30))
        await stopping
    finally:
        await b.stop()
    again = {name: n for name, n in seen.items() if n > 1}
    assert again == {}, f"delivered more than once: {again}"


async def test_a_message_handed_back_at_once_past_the_delivery_limit_runs_and_the_last_delivery_is_a_letter(
    stack: LocalStack, client: Client
) -> None:
    """A stopping replica of release 0.31 handed back at once (nak) what its open pull requests still brought,
    each bounce a delivery; in a rolling upgrade from 0.31 a peer took a run's ``tool.succeeded`` on its seventh
    delivery and dead-lettered it as crashing on every one. A message past ``max_deliver`` that came back
    sooner than that many ack waits was handed back, not crashed on: it runs. The consumer's last delivery
    (``last_delivery``) is dead-lettered whatever its age, so nothing is left undelivered in silence."""
    from shared.bus import Bus, ConsumerSpec, consumer_config, current_deliveries
    from shared.bus.wire import last_delivery
    from shared.settings import Settings

    marker = "bounced-" + os.urandom(4).hex()
    settings = Settings(nats_url=str(stack.nats_url), ack_wait_s=5, max_deliver=3)
    bus = Bus(settings, "bouncetest")
    seen: dict[str, int] = {}
    last = last_delivery(settings.max_deliver)
    bounces = {"runs": 3, "lettered": last - 1}  # handed back this often before this release's replica takes it

    def consume(name: str) -> tuple[str, str]:
        subject, durable = S.tool_execute(f"test_bounce_{marker}_{name}"), f"bouncetest_{marker}_{name}"

        @bus.consumer(durable=durable, filter_subjects=[subject], model=RunAdvance)
        async def on(ev: RunAdvance) -> None:
            seen[ev.run_id] = current_deliveries()

        return subject, durable

    consumers = {name: consume(name) for name in bounces}
    await bus.connect()
    try:
        for name, (subject, durable) in consumers.items():
            spec = ConsumerSpec(S.STREAM_CMD, durable, (subject,), "bouncetest")
            await bus.js.add_consumer(spec.stream, consumer_config(spec, settings))
            await bus.publish(subject, RunAdvance(run_id=f"{marker}-{name}", iteration=0), msg_id=f"{marker}-{name}")
            old = await bus.js.pull_subscribe_bind(durable, stream=spec.stream)  # the old replica, stopping
            for _ in range(bounces[name]):
                (msg,) = await old.fetch(1, timeout=bound(5))
                await msg.nak()
            await old.unsubscribe()
        await bus.start()
        await eventually(lambda: f"{marker}-runs" in seen, what="the bounced message handled", within=bound(20))
        letters = []
        for _ in range(int(bound(40))):
            letters = [d for d in await client.dead_letters() if marker in d.body]
            if letters:
                break
            await asyncio.sleep(0.5)
    finally:
        await bus.stop()
    assert seen == {f"{marker}-runs": 4}, seen  # its fourth delivery ran, past max_deliver=3
    assert [(d.deliveries, d.reason) for d in letters] == [
        (last, f"not completed after {last - 1} deliveries (the handler crashed or hung)")
    ], letters


async def test_the_benchmarks_in_process_floor_drives_a_whole_run() -> None:
    """`make bench` compares the service loop with this in-process driver of the same domain code."""
    from bench.throughput import floor_steps

    durations = await floor_steps(1, 6)
    assert len(durations) == 5 and all(d > 0 for d in durations)


async def test_messages_of_one_run_are_handled_one_at_a_time_and_runs_overlap(stack: LocalStack) -> None:
    """The bus helper's consumer: many messages in flight, never two of the same run at once."""
    from shared.bus import Bus
    from shared.settings import Settings

    tag = os.urandom(4).hex()
    subject = S.tool_execute(f"test_serial_{tag}")
    bus = Bus(Settings(nats_url=str(stack.nats_url), ack_wait_s=3), "serialtest")
    active: dict[str, int] = {}
    peak_run, peak_all, done = 0, 0, 0
    finished = asyncio.Event()
    runs, per_run, hold = 4, 5, 0.3

    @bus.consumer(durable=f"serialtest_{tag}", filter_subjects=[subject], model=RunAdvance)
    async def on_event(ev: RunAdvance) -> None:
        nonlocal peak_run, peak_all, done
        active[ev.run_id] = active.get(ev.run_id, 0) + 1
        peak_run, peak_all = max(peak_run, active[ev.run_id]), max(peak_all, sum(active.values()))
        await asyncio.sleep(hold)
        active[ev.run_id] -= 1
        done += 1
        if done == runs * per_run:
            finished.set()

    await bus.connect()
    try:
        for n in range(per_run):
            for r in range(runs):
                await bus.publish(subject, RunAdvance(run_id=f"run-{tag}-{r}", iteration=n))
        t0 = time.monotonic()
        await bus.start()
        await asyncio.wait_for(finished.wait(), bound(60))
        wall = time.monotonic() - t0
    finally:
        await bus.stop()
    assert peak_run == 1, "two messages of one run were handled at once"
    assert peak_all >= runs - 1, f"runs did not overlap (at most {peak_all} at once)"
    assert wall < 0.6 * runs * per_run * hold, f"{wall:.1f}s: handled one after another"


async def test_a_letter_handed_back_is_a_redelivery_to_the_handler_that_gave_up_on_it(
    client: Client, stack: LocalStack
) -> None:
    """A handler that failed on every delivery is dead-lettered; once handed back (`Client.requeue`) the same
    handler runs it again and sees the deliveries before it (`current_deliveries()` goes on counting), so a
    handler that reuses what an earlier take stored (the planner's model answer, the executor's ledger claim)
    does so after a requeue too; the letter names where it goes back."""
    from shared.bus import Bus, current_deliveries
    from shared.settings import Settings

    marker = "requeue-" + os.urandom(4).hex()
    subject = S.tool_execute(f"test_requeue_{marker}")
    bus = Bus(Settings(nats_url=str(stack.nats_url), ack_wait_s=1, max_deliver=2), "requeuetest")
    seen: list[int] = []
    broken = [True]

    @bus.consumer(durable=f"requeuetest_{marker}", filter_subjects=[subject], model=RunAdvance)
    async def on_advance(ev: RunAdvance) -> None:
        seen.append(current_deliveries())
        if broken[0]:
            raise RuntimeError("broken until fixed")

    await bus.connect()
    try:
        await bus.publish(subject, RunAdvance(run_id=marker, iteration=0), msg_id=marker)
        await bus.start()
        (letter,) = await letters_where(client, marker, timeout=bound(30))
        assert letter.deliveries == 2 and letter.requeue_to == S.requeue("requeuetest"), letter
        (seq,) = [n.seq for n in await client.letters() if n.letter == letter]
        broken[0] = False  # the fault is fixed
        await client.requeue(seq)
        for _ in range(int(bound(100))):
            if len(seen) == 3:
                break
            await asyncio.sleep(0.1)
    finally:
        await bus.stop()
    assert seen == [1, 2, 3], seen
    assert await letters_where(client, marker, timeout=bound(0.5)) == [letter]  # it did not fail again
