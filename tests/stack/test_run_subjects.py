"""Reading or watching one run costs that run's events, not every event in the stream.

Every event of a run ends with the run id (``S.run_scoped``), so ``Client.events(run_id)`` is a
server-side subject filter and ``Client.watch(run_id)`` subscribes to that run's subjects only.
The cost is counted as the messages the reading client's connection received from the server
(``nc.stats["in_msgs"]``), never as wall time.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from loopwarden.client import Client, Event
from loopwarden.stack import LocalStack
from shared import subjects as S
from shared.messages import SimulatedCall
from shared.scenario import parse_scenario
from tests.support.runs import run_scenario
from tests.support.stacks import settings_for
from tests.support.timing import bound, eventually

NOISE_RUNS = 40
NOISE_PER_RUN = 10
CONTROL = 4  # replies a read costs besides the events (consumer create and info, a heartbeat)

ONE_TOOL = {
    "name": "one-run-among-many",
    "task": "What does the corpus say about dedupe?",
    "planner": [
        {"tool_calls": [{"name": "search", "input": {"query": "dedupe"}}]},
        {"tool_calls": [{"name": "submit_result", "input": {"answer": "dedupe is covered"}}]},
    ],
}


async def other_runs_events(client: Client, tag: str) -> int:
    """Events of many other runs, published the way services publish (through the bus)."""
    items = [
        (
            S.run_event("note"),
            SimulatedCall(run_id=f"run-noise-{tag}-{r}", iteration=i).model_dump_json().encode(),
            None,
        )
        for r in range(NOISE_RUNS)
        for i in range(NOISE_PER_RUN)
    ]
    for start in range(0, len(items), 50):
        await asyncio.gather(
            *(
                client.bus.publish(s, body, run_id=f"run-noise-{tag}-{n // NOISE_PER_RUN}")
                for n, (s, body, _) in enumerate(items[start : start + 50], start)
            )
        )
    return len(items)


def received(client: Client) -> int:
    return int(client.bus.nc.stats["in_msgs"])


async def test_reading_one_runs_history_delivers_only_that_runs_messages(client: Client, stack: LocalStack) -> None:
    state = await run_scenario(client, ONE_TOOL)
    assert state.status == "completed"
    noise = await other_runs_events(client, "read")
    stored = (await client.bus.js.stream_info(S.STREAM_EVT)).state.messages
    assert stored >= noise

    async with Client(settings_for(stack), identity="reader") as reader:
        before = received(reader)
        history = await reader.events(state.run_id)
        cost = received(reader) - before

        kinds = [e.kind for e in history]
        assert {e.run_id for e in history} == {state.run_id}
        assert kinds[-1] == "run.completed", kinds
        assert any(e.kind.startswith("tool.succeeded.search") for e in history), kinds
        assert all(e.subject.endswith(f".{S.token(state.run_id)}") for e in history)
        print(f"\nevents(run): {cost} messages received for {len(history)} events; LW_EVT holds {stored}")
        # What the server sent is the run's events (and a few control replies), not the stream.
        assert len(history) <= cost <= len(history) + CONTROL, (cost, len(history), stored)
        assert cost * 10 < stored

        # One stem of one run: the exact subject is the filter.
        before = received(reader)
        final = await reader.events(state.run_id, subjects=S.run_event("completed"))
        cost = received(reader) - before
        assert [e.kind for e in final] == ["run.completed"]
        assert cost <= 1 + CONTROL

        # The same measure does count the whole stream when asked for every run's events.
        before = received(reader)
        everything = await reader.events()
        assert received(reader) - before >= noise
        assert len(everything) >= noise


async def test_watching_one_run_receives_only_that_runs_messages(client: Client, stack: LocalStack) -> None:
    async with Client(settings_for(stack), identity="watcher") as watcher:
        run_id = f"run-watched-{id(watcher):x}"
        seen: list[Event] = []
        done = asyncio.Event()

        watch = await watcher.watch(run_id)  # subscribed when it returns

        async def follow() -> None:
            async for event in watch:
                seen.append(event)
                if event.kind == "run.completed":
                    done.set()

        before = received(watcher)
        task = asyncio.create_task(follow())
        try:
            submitted = asyncio.create_task(client.submit_scenario(parse_scenario(ONE_TOOL), run_id=run_id))
            noise = await other_runs_events(client, "watch")  # other runs' events while it runs
            await submitted
            state = await client.wait(run_id, timeout=bound(30))
            assert state.status == "completed"
            await asyncio.wait_for(done.wait(), timeout=bound(10))
            await watcher.bus.nc.flush()
            cost = received(watcher) - before
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await watch.close()
        assert {e.run_id for e in seen} == {run_id}
        assert len(seen) >= 4, [e.kind for e in seen]
        print(f"\nwatch(run): {cost} messages received for {len(seen)} events; {noise} other runs' events meanwhile")
        assert len(seen) <= cost <= len(seen) + 2, (cost, len(seen))
        assert cost * 10 < noise


async def test_waiting_for_one_run_is_not_woken_by_other_runs(client: Client, stack: LocalStack) -> None:
    async with Client(settings_for(stack), identity="waiter") as waiter:
        run_id = f"run-waited-{id(waiter):x}"
        before = received(waiter)
        waiting = asyncio.create_task(waiter.wait(run_id, timeout=bound(60)))
        # subscribed to the run's events before anything is published: polled, not slept on (a sleep raced the task)
        filters = len(S.run_filters(run_id, f"{S.RUN_EVENT_PREFIX}.>"))
        subscribed = lambda: len(waiter._run_events.get(run_id, ())) == filters  # noqa: E731
        await eventually(subscribed, what="the wait's subscriptions", within=bound(10))
        await waiter.bus.nc.flush()  # and the server has them
        noise = await other_runs_events(client, "wait")  # other runs' run events while it waits
        await client.submit_scenario(parse_scenario(ONE_TOOL), run_id=run_id)
        state = await waiting
        cost = received(waiter) - before
        assert state.status == "completed"
        print(f"\nwait(run): {cost} messages received; {noise} other runs' events meanwhile")
        # The run's own events, its state reads and the final check; none of the other runs' events.
        assert cost * 5 < noise, (cost, noise)
        assert not waiter._run_events and not waiter._waiters  # the run's subscriptions are gone


def test_run_filters_cover_every_run_scoped_stem() -> None:
    run = "run-abc"
    stems: list[Any] = [
        S.run_event("completed"),
        S.tool_succeeded("search"),
        S.tool_attempt("search"),
        S.failure("transient", "search"),
        S.failure("loop", None),
        S.budget_event("warn"),
        S.JUDGE_VERDICT,
        S.ESCALATION_RAISED,
        S.ESCALATION_RESOLVED,
    ]
    filters = S.run_filters(run)
    for stem in stems:
        subject = S.run_scoped(stem, run)
        assert S.stem(subject) == stem
        assert sum(matches(f, subject) for f in filters) == 1, subject
        assert not any(matches(f, S.run_scoped(stem, "run-other")) for f in filters)
    assert S.run_scoped(S.mcp_server_event("files"), run) == S.mcp_server_event("files")
    assert S.run_filters(run, f"{S.FAILURE_PREFIX}.>") == [
        f"{S.FAILURE_PREFIX}.*.{run}",
        f"{S.FAILURE_PREFIX}.*.*.{run}",
    ]
    # routing by stem keeps working with a trailing wildcard
    assert matches(f"{S.FAILURE_PREFIX}.fatal.>", S.run_scoped(S.failure("fatal", "x"), run))
    assert matches(S.any_run(S.JUDGE_VERDICT), S.run_scoped(S.JUDGE_VERDICT, run))


def matches(pattern: str, subject: str) -> bool:
    """NATS subject matching (``*`` one token, ``>`` the rest)."""
    p, s = pattern.split("."), subject.split(".")
    for i, tok in enumerate(p):
        if tok == ">":
            return len(s) > i
        if i >= len(s) or (tok != "*" and tok != s[i]):
            return False
    return len(p) == len(s)


async def test_waiting_reads_the_run_on_status_events_not_on_every_step(client: Client, stack: LocalStack) -> None:
    """A step's progress events (``PROGRESS_EVENTS``) do not make a waiter read the run's record again:
    a 12-step run is read a few times (start, the final event, the one-second safety net), not per step."""
    steps = 12
    scenario = {
        "name": "many-steps-waited",
        "task": "Add the numbers one by one, then say done.",
        "answer_mode": "text",
        "planner": [
            *({"tool_calls": [{"name": "calculator", "input": {"expression": f"{k}+1"}}]} for k in range(steps)),
            {"text": "done"},
        ],
        "limits": {"max_iterations": steps + 3},
    }
    async with Client(settings_for(stack), identity="waiter") as waiter:
        reads: list[str] = []

        async def on_read(msg: Any) -> None:
            if (msg.reply or "").startswith(waiter.bus.inbox_prefix):
                reads.append(msg.subject)

        sub = await client.bus.nc.subscribe(f"$JS.API.DIRECT.GET.KV_{S.KV_RUNS}.>", cb=on_read)
        await client.bus.nc.flush()
        try:
            run_id = await client.submit_scenario(parse_scenario(scenario))
            started = asyncio.get_running_loop().time()
            state = await waiter.wait(run_id, timeout=bound(60), history=False)
            seconds = asyncio.get_running_loop().time() - started
            await asyncio.sleep(0.2)
        finally:
            await sub.unsubscribe()
        assert state.status == "completed" and state.iteration.n >= steps
        print(f"\nwait over {steps} steps in {seconds:.2f} s: {len(reads)} reads of the run's record")
        assert reads, "the waiter's reads were not seen: the test would prove nothing"
        # once at the start, once per status event (started, finished), once per second as a safety net
        assert len(reads) <= 4 + int(seconds), (len(reads), seconds)
