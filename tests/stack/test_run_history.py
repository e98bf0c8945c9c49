"""A run's record stays the same size however long the run; its conversation is append-only beside it.

The record (``lw_runs``, the ``RunSnapshot`` contract) is rewritten at every step; the messages
go to ``lw_history`` once each. These tests read what the server stores: every write of one run's
record (a core subscription to the bucket's subject), and the history keys themselves.
"""

from __future__ import annotations

import json
from typing import Any

from loopwarden.client import Client, new_run_id
from loopwarden.stack import LocalStack
from services.planner.state import RunState
from services.planner.store import RunStore
from services.planner.turns import resolve_config, start_run
from shared import history
from shared import subjects as S
from shared.bus import Unchanged
from shared.messages import ChatMessage, RunLimits, RunSubmit
from shared.scenario import parse_scenario
from shared.settings import Settings
from tests.support.runs import healthy_planner_finishes, planner_dies
from tests.support.timing import bound


def steps(n: int) -> dict[str, Any]:
    planner: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "calculator", "input": {"expression": f"{k}+1000"}}]} for k in range(n)
    ]
    planner.append({"text": "done"})
    return {
        "name": f"steps-{n}",
        "task": "Add the numbers one by one, then say done.",
        "planner": planner,
        "answer_mode": "text",
        "limits": {"max_iterations": n + 5, "cost_ceiling_usd": 10_000, "run_token_budget": 50_000_000},
    }


async def test_a_long_runs_record_does_not_grow_and_its_history_is_whole(client: Client) -> None:
    n = 40
    scenario = parse_scenario(steps(n))
    run_id = new_run_id()
    sizes: list[int] = []

    async def on_write(msg: Any) -> None:
        sizes.append(len(msg.data))

    sub = await client.bus.nc.subscribe(f"$KV.{S.KV_RUNS}.{run_id}", cb=on_write)
    try:
        await client.submit_scenario(scenario, run_id=run_id)
        state = await client.wait(run_id, timeout=bound(90))
    finally:
        await sub.unsubscribe()
    assert state.status == "completed", state.final_reason
    # a write per step (a tool's outcome saved with the turn it schedules; two where they are saved apart,
    # e.g. the run's next message went to the other replica); compare steps 20-25 with steps 35-40
    assert len(sizes) >= n, len(sizes)
    per_step = len(sizes) / n
    middle, late = sizes[round(20 * per_step) : round(25 * per_step)], sizes[round(35 * per_step) : -2]
    print(f"record bytes: first {sizes[:4]}, steps 20-25 {middle}, steps 35-40 {late}")
    assert max(late) <= 1.05 * max(middle), (middle, late)
    assert max(sizes) < 12_000, max(sizes)  # the old whole-history record was ~20 KB by step 40

    # the conversation: the task, a model turn and its tool result per step, the answer
    assert state.history_len == len(state.messages) == 2 * n + 2
    assert [m.role for m in state.messages[:3]] == ["user", "assistant", "user"]
    results = [json.loads(b.content)["result"] for m in state.messages for b in m.content if b.type == "tool_result"]
    assert results == [k + 1000 for k in range(n)]
    assert state.messages[-1].text() == "done"
    # all but the record's tail are in lw_history, one key per message, in order
    stored = await history.read(client.bus, run_id, 0, state.tail_from)
    assert stored == state.messages[: state.tail_from]
    assert await client.history(run_id, last=3) == state.messages[-3:]


def run_record(run_id: str) -> RunState:
    submit = RunSubmit(run_id=run_id, task="Count.", limits=RunLimits(), answer_mode="text")
    state = start_run(submit, resolve_config(submit, Settings(), {}), []).state
    state.remember("submit", [])
    return state


def append(text: str) -> Any:
    def change(s: RunState | None) -> tuple[RunState, None] | Unchanged[None]:
        assert s is not None
        s.messages.append(ChatMessage.user(text))
        return s, None

    return change


def texts(messages: list[ChatMessage]) -> list[str]:
    return [m.text() for m in messages]


async def test_replicas_read_back_what_they_did_not_see_and_a_dropped_tail_is_stored_first(client: Client) -> None:
    """Two planner replicas' stores on one run: a save whose tail was never written (the replica
    died right after its CAS), a replica that never saw the run, a conflict, and a compaction."""
    run_id = new_run_id()
    a, b = RunStore(client.bus), RunStore(client.bus)
    first = run_record(run_id)
    task = first.messages[0].text()
    await a.create(first)
    await a.store_tail(first)

    await a.update(run_id, append("one"))  # saved; replica a "dies" before writing its tail to lw_history
    snap = await client.state(run_id)
    assert snap is not None and (snap.tail_from, snap.history_len, texts(snap.tail)) == (1, 2, ["one"])
    missing, _ = await client.bus.kv_get(S.KV_HISTORY, history.key(run_id, 1), ChatMessage)
    assert missing is None
    assert texts(await client.history(snap)) == [task, "one"]  # a reader takes it from the record

    seen = await b.load(run_id)  # replica b never saw the run: the record, the history, the tail
    assert seen is not None and texts(seen.messages) == [task, "one"]
    await b.update(run_id, append("two"))  # its save drops "one" from the record: stored first
    one, _ = await client.bus.kv_get(S.KV_HISTORY, history.key(run_id, 1), ChatMessage)
    assert one is not None and one.text() == "one"

    await a.update(run_id, append("three"))  # a is a revision behind: conflict, re-read, applied again
    snap = await client.state(run_id, history=True)
    assert snap is not None and texts(snap.messages) == [task, "one", "two", "three"]
    assert snap.history_len == 4

    def compact(s: RunState | None) -> tuple[RunState, None]:
        assert s is not None
        s.messages = [ChatMessage.user("summary of one and two"), s.messages[-1]]
        return s, None

    await b.update(run_id, compact)  # b is behind too; compaction starts the live history at a new seq
    snap = await client.state(run_id, history=True)
    assert snap is not None and (snap.history_start, snap.history_len) == (4, 6)
    assert texts(snap.messages) == ["summary of one and two", "three"]
    kept = await history.read(client.bus, run_id, 0, 4)  # older entries are never rewritten
    assert texts(kept) == [task, "one", "two", "three"]
    fresh = await RunStore(client.bus).load(run_id)
    assert fresh is not None and texts(fresh.messages) == ["summary of one and two", "three"]


async def test_a_planner_dying_after_saving_a_record_loses_no_message_of_the_history(no_planner: LocalStack) -> None:
    """The only planner exits right after its first save (``LW_FAULT_INJECT=after_run_saved``; an idle fleet
    starts the run at the door): the record carries the task message in its tail, nothing went to lw_history and
    nothing was published. A healthy planner takes the redelivered submit over, re-publishes the stored outbox,
    and stores the tail before its first save drops it from the record; the run's history is whole."""
    async with Client(Settings(nats_url=no_planner.nats_url)) as client:
        run_id = await client.submit_scenario(parse_scenario(steps(3)), accepted=False)  # no planner yet
        await planner_dies(no_planner, "after_run_saved", "planner-dies")
        snap = await client.state(run_id)
        assert snap is not None and snap.status == "running" and snap.history_len == 1 and len(snap.tail) == 1
        lost, _ = await client.bus.kv_get(S.KV_HISTORY, history.key(run_id, 0), ChatMessage)
        assert lost is None  # the task message is only in the record
        assert await client.events(run_id, timeout=bound(0.5)) == []  # nothing was published

        state = await healthy_planner_finishes(no_planner, client, run_id)
        assert state.status == "completed", state.final_reason
        assert state.history_len == len(state.messages) == 2 * 3 + 2
        first, _ = await client.bus.kv_get(S.KV_HISTORY, history.key(run_id, 0), ChatMessage)
        assert first is not None and first == state.messages[0] and "Add the numbers" in first.text()
        assert await history.read(client.bus, run_id, 0, state.tail_from) == state.messages[: state.tail_from]
        kinds = [e.kind for e in await client.events(run_id)]
        assert kinds.count("run.started") == 1 and kinds[-1] == "run.completed", kinds
