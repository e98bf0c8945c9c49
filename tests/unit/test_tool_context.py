"""A tool's context opens a bucket only when the tool asks for one: the demo tools' side-effect ledger
(``lw_demo``) is theirs, not something every production tool call carries."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from services.executor.app import load_registry
from shared.settings import Settings
from shared.subjects import KV_DEMO
from shared.tools import STATE_BUCKET, ToolContext


@functools.cache
def hosted_tools() -> dict[str, Any]:
    return dict(load_registry(Settings()).tools)


def call(tool: str, args: dict[str, Any]) -> list[str]:
    """Run the hosted ``tool`` with a context whose opener records the buckets asked for (and opens none:
    the tool then works as it does outside the executor)."""
    opened: list[str] = []

    async def opener(name: str) -> None:
        opened.append(name)

    hosted = hosted_tools()[tool]
    asyncio.run(hosted.fn(args, ToolContext(run_id="run-ctx", call_id="c1", attempt=1, buckets=opener)))
    return opened


def test_a_tool_that_keeps_nothing_opens_no_bucket() -> None:
    assert call("calculator", {"expression": "6 * 7"}) == []


def test_the_demo_payment_tool_opens_its_ledger_itself() -> None:
    assert call("charge_card", {"customer_id": "cus_ada1", "amount_cents": 1200}) == [KV_DEMO]


def test_run_state_opens_its_bucket_when_first_used() -> None:
    opened: list[str] = []

    async def opener(name: str) -> None:
        opened.append(name)

    async def go() -> Any:
        ctx = ToolContext("run-ctx-state", "c1", 1, buckets=opener)
        state = ctx.state
        assert opened == []  # taking the handle opens nothing
        await state.set("n", 1)
        return await state.get("n")

    assert asyncio.run(go()) == 1
    assert opened == [STATE_BUCKET, STATE_BUCKET]
