"""Progressive tool disclosure end to end: with 30 tools registered, the model sees one line per
tool, and a tool's full schema from its first call on; a run uses 3 of the 30. Through the real
SDK against the local Messages-API server, so the tools section is what the API would receive."""

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

USED = ("search", "calculator", "exchange_rate")


@pytest.fixture
async def thirty_tools(client: Client) -> AsyncIterator[dict[str, ToolContract]]:
    """The stack's tools plus catalogue entries up to 30 (registered for this test, removed after it:
    the planner re-reads the catalogue every 2 s, so later tests see the stack as it was)."""
    base = await registered(client)
    extra = {n: c for n, c in catalogue(30, base).items() if n not in base}
    kv = await client.bus.kv(S.KV_CONTRACTS)
    for name, contract in extra.items():
        await client.bus.kv_put(S.KV_CONTRACTS, S.kv_key(name), contract)
    await asyncio.sleep(2.1)  # the planners' catalogue cache
    try:
        yield {**base, **extra}
    finally:
        for name in extra:
            await kv.purge(S.kv_key(name))
        await asyncio.sleep(2.1)


def one_lined(tool: dict[str, Any]) -> bool:
    return tool["input_schema"] == C.ONE_LINE_SCHEMA


async def test_a_run_using_3_of_30_tools_sees_one_line_for_the_rest(
    client: Client, messages_api: FakeModel, thirty_tools: dict[str, ToolContract]
) -> None:
    assert len(thirty_tools) >= 30
    key = f"p{uuid.uuid4().hex[:8]}"
    messages_api.script(
        key,
        [
            call("search", {"query": "jetstream deduplication"}),
            call("calculator", {"expr": "6*7"}),  # blind: the one-line entry had no schema
            call("calculator", {"expression": "6*7"}),
            call("exchange_rate", {"base": "usd", "quote": "eur"}),
            call("submit_result", {"answer": "done"}),
        ],
    )
    run_id = f"run-prog-{key}"
    await client.submit(RunSubmit(run_id=run_id, task=f"Use a few tools, then submit. [script:{key}]"))
    state = await client.wait(run_id, timeout=bound(60))
    assert state.status == "completed", state.final_reason
    reqs = messages_api.requests[key]
    assert len(reqs) == 5

    def tools(i: int) -> dict[str, dict[str, Any]]:
        return {t["name"]: t for t in reqs[i]["tools"]}

    first = tools(0)
    assert len(first) == len(thirty_tools)
    assert not one_lined(first["submit_result"])  # the terminal tool is always whole
    assert all(one_lined(t) for n, t in first.items() if n != "submit_result")
    assert C.PROGRESSIVE_NOTE in reqs[0]["system"][0]["text"]
    # from its first call on, a tool is offered whole
    assert not one_lined(tools(1)["search"]) and one_lined(tools(1)["calculator"])
    # the blind call was refused with the schema, not executed
    refused = reqs[2]["messages"][-1]["content"][0]
    assert refused["is_error"] is True and '"expression"' in refused["content"]
    last = tools(4)
    assert {n for n, t in last.items() if not one_lined(t)} == {*USED, "submit_result"}
    assert sum(one_lined(t) for t in last.values()) == len(thirty_tools) - 4

    # what the tools section costs: one line per tool against every schema whole
    full = sum(
        tokens.count_json(t)
        for t in (
            {"name": c.name, "description": c.description, "input_schema": c.input_schema}
            for c in thirty_tools.values()
        )
    )
    progressive = sum(tokens.count_json(t) for t in first.values()) + tokens.count(C.PROGRESSIVE_NOTE)
    assert progressive < 0.5 * full, (progressive, full)
    print(json.dumps({"tools": len(first), "full": full, "progressive": progressive}))
