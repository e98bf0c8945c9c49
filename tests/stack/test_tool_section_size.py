"""Progressive disclosure at the margin, end to end (issue 28, edge 4): with 30 tools described as the model
vendors recommend (3-4 sentences), the tools section the provider receives stays at or under a quarter of
the whole catalogue's tokens on every request of a run, also after one and then two tools' full schemas
were sent. Counted with the project's tokenizer (tiktoken cl100k) on the Messages API bodies the real SDK
sent; the system prompt's line explaining the summaries counts with the tools."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from bench.cost import catalogue
from loopwarden.client import Client
from loopwarden.fake_model import FakeModel
from services.planner import context as C
from shared import subjects as S
from shared import tokens
from shared.messages import RunSubmit, ToolContract
from tests.support.model_turns import call
from tests.support.reads import registered
from tests.support.timing import bound

BASE = ("calculator", "exchange_rate", "submit_result")
SHARE = 0.25


@pytest.fixture
async def vendor_catalogue(client: Client) -> AsyncIterator[dict[str, ToolContract]]:
    """Three of the stack's tools and 27 more with three-sentence descriptions and realistic schemas,
    registered for this test and removed after it (the planners re-read the catalogue every 2 s)."""
    stack_tools = await registered(client)
    tools = catalogue(30, {n: stack_tools[n] for n in BASE})
    extra = [n for n in tools if n not in stack_tools]
    kv = await client.bus.kv(S.KV_CONTRACTS)
    for name in extra:
        await client.bus.kv_put(S.KV_CONTRACTS, S.kv_key(name), tools[name])
    await asyncio.sleep(2.1)  # the planners' catalogue cache
    try:
        yield tools
    finally:
        for name in extra:
            await kv.purge(S.kv_key(name))
        await asyncio.sleep(2.1)


def whole(c: ToolContract) -> dict[str, Any]:
    return {"name": c.name, "description": c.description, "input_schema": c.input_schema}


def section(request: dict[str, Any]) -> int:
    """The tools section of one request as sent: every tool entry, and the note about summaries if any."""
    note = tokens.count(C.PROGRESSIVE_NOTE) if C.PROGRESSIVE_NOTE in request["system"][0]["text"] else 0
    return sum(tokens.count_json(t) for t in request["tools"]) + note


async def test_the_tools_section_stays_under_a_quarter_of_the_catalogue_on_every_request(
    client: Client, messages_api: FakeModel, vendor_catalogue: dict[str, ToolContract]
) -> None:
    assert len(vendor_catalogue) == 30
    key = f"q{uuid.uuid4().hex[:8]}"
    messages_api.script(
        key,
        [
            call("calculator", {"expression": "6*7"}),  # its full schema is sent from the next request on
            call("exchange_rate", {"base": "usd", "quote": "eur"}),  # and then a second one
            call("submit_result", {"answer": "42, and the rate"}),
        ],
    )
    run_id = f"run-toolsize-{key}"
    await client.submit(
        RunSubmit(run_id=run_id, task=f"Compute, convert, submit. [script:{key}]", tools=list(vendor_catalogue))
    )
    state = await client.wait(run_id, timeout=bound(40))
    assert state.status == "completed", state.final_reason
    reqs = messages_api.requests[key]
    assert len(reqs) == 3

    full = sum(tokens.count_json(whole(c)) for c in vendor_catalogue.values())
    shares = [section(r) / full for r in reqs]
    print(json.dumps({"full": full, "sections": [section(r) for r in reqs], "shares": shares}))
    # what each request held: 29 summaries and the terminal tool whole, then one, then two more whole
    summarized = [sum(t["input_schema"] == C.ONE_LINE_SCHEMA for t in r["tools"]) for r in reqs]
    assert [len(r["tools"]) for r in reqs] == [30, 30, 30]
    assert summarized == [29, 28, 27]
    for i, share in enumerate(shares):
        assert share <= SHARE, f"request {i + 1}: tools section {share:.1%} of the catalogue (limit {SHARE:.0%})"
    # a summary is the tool's name, its description's first sentence and an open object schema: nothing else
    summary = next(t for t in reqs[0]["tools"] if t["name"] == "lookup_01")
    assert summary == {
        "name": "lookup_01",
        "description": "Look up records of kind 1 by id or name.",
        "input_schema": {"type": "object"},
    }
