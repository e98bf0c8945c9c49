"""Prompt caching through the real SDK against the local Messages-API server: breakpoints on the
stable prefix and the conversation, cache reads and writes in the run's usage, cost at cache rates,
and the GenAI span attributes."""

from __future__ import annotations

import asyncio
import itertools
import uuid

from loopwarden.client import Client
from loopwarden.fake_model import FakeModel
from shared.messages import ModelCalledDetail, RunSubmit
from shared.pricing import cost_usd
from tests.support.otlp_collector import OtlpCollector
from tests.support.timing import bound
from tests.support.tracing import spans_of_run

TOOLS = ["calculator", "submit_result"]
CONTEXT = "Background for the task, kept verbatim on every turn: " + " ".join(
    f"Item {i} of the ledger is worth {i * 7} units and was checked on day {i % 28 + 1}." for i in range(90)
)


def tool_use(name: str, args: dict, id_: str) -> dict:
    return {"type": "tool_use", "id": id_, "name": name, "input": args}


async def test_turns_read_the_prefix_earlier_turns_cached(
    client: Client, messages_api: FakeModel, otlp: OtlpCollector
) -> None:
    key = f"c{uuid.uuid4().hex[:8]}"
    messages_api.script(
        key,
        [
            {"content": [tool_use("calculator", {"expression": f"{i}*7"}, f"toolu_c{i}")]}
            for i in range(1, 4)  # usage is not scripted: the server counts it and answers from its cache
        ]
        + [{"content": [tool_use("submit_result", {"answer": "done"}, "toolu_c9")]}],
    )
    run_id = f"run-cache-{key}"
    # The run's own catalogue (another test registering a tool mid-run would change the prefix, and a
    # changed prefix is a miss, as with the real API); the long task makes the prompt cacheable alone.
    await client.submit(
        RunSubmit(run_id=run_id, task=f"Multiply a few numbers by 7. [script:{key}]\n\n{CONTEXT}", tools=TOOLS)
    )
    state = await client.wait(run_id, timeout=bound(60))
    assert state.status == "completed", state.final_reason

    reqs = messages_api.requests[key]
    assert len(reqs) == 4
    for body in reqs:
        # the stable prefix (tools + system) ends at a breakpoint on the system prompt ...
        assert body["system"][-1]["cache_control"] == {"type": "ephemeral"}
        # ... and the conversation's last block carries the rolling one (the only other one)
        assert body["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
        marks = sum('"cache_control"' in str(b).replace("'", '"') for m in body["messages"] for b in m["content"])
        assert marks == 1

    u = state.usage
    # turn 1 writes the prefix; every later turn reads at least everything turn 1 cached
    assert u.cache_creation_input_tokens > 0 and u.cache_read_input_tokens > 0
    assert u.cache_read_input_tokens + u.cache_creation_input_tokens <= u.input_tokens
    events = sorted(
        (e for e in await client.events(run_id) if e.kind == "run.model_called"), key=lambda e: e.payload["iteration"]
    )
    assert len(events) == 4
    # a count of 0 is stored as nothing (``lean_json``): read as the contract reads it
    reads = [ModelCalledDetail.model_validate(e.payload["detail"]).cache_read_input_tokens for e in events]
    writes = [ModelCalledDetail.model_validate(e.payload["detail"]).cache_creation_input_tokens for e in events]
    # each later turn reads everything the turn before it sent, and writes the rest
    assert all(w > 0 for w in writes)
    assert reads[0] == 0  # nothing of this run's prompt was cached before it
    assert all(later > earlier for earlier, later in itertools.pairwise(reads)), reads
    assert all(reads[i + 1] >= reads[i] + writes[i] for i in range(3)), (reads, writes)
    # billed at cache rates: cheaper than the same tokens uncached
    uncached = cost_usd(state.model, u.input_tokens, u.output_tokens)
    expected = cost_usd(
        state.model,
        u.input_tokens,
        u.output_tokens,
        cache_read=u.cache_read_input_tokens,
        cache_write=u.cache_creation_input_tokens,
    )
    assert abs(u.cost_usd - expected) < 1e-6
    assert u.cost_usd < uncached

    # the GenAI spans say what was read and written
    spans = await spans_of_run(otlp, client, run_id, {"loopwarden-planner"})
    for _ in range(int(bound(100))):  # the planners export in batches: wait for all four calls
        chats = [s for s in otlp.trace(spans[0].trace_id) if s.name.startswith("chat ")]
        if len(chats) >= 4:
            break
        await asyncio.sleep(0.1)
    assert len(chats) == 4
    span_reads = [s.attributes["gen_ai.usage.cache_read.input_tokens"] for s in chats]
    span_writes = [s.attributes["gen_ai.usage.cache_creation.input_tokens"] for s in chats]
    assert sorted(span_reads) == sorted(reads) and sorted(span_writes) == sorted(writes)
    assert sum(span_reads) == u.cache_read_input_tokens and sum(span_writes) == u.cache_creation_input_tokens
    assert all(s.attributes["loopwarden.cost.usd"] > 0 for s in chats)
