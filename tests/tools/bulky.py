"""Real test tools for large payloads: each run is counted in ``lw_demo`` (a side effect), so a
test can tell how often a tool ran for a run."""

from __future__ import annotations

import json
import uuid
from typing import Any

from shared.subjects import KV_DEMO
from shared.tools import ToolContext


async def _count(ctx: ToolContext, kind: str) -> None:
    counts = await ctx.bucket(KV_DEMO)
    if counts is not None:
        await counts.put(f"{kind}.{ctx.run_id}.{uuid.uuid4().hex[:12]}", json.dumps({"call": ctx.call_id}).encode())


async def bulk_report(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """A report of ``megabytes`` MB (1000-byte rows). Not idempotent: every run is recorded."""
    await _count(ctx, "bulk")
    rows = int(float(args["megabytes"]) * 1000)
    row = (args.get("fill", "x") * 1000)[:1000]
    return {"rows": [row] * rows, "row_count": rows}


class Handle:
    """An object with no JSON form (say, an open connection a buggy tool returns by mistake)."""


async def odd_value(args: dict[str, Any], ctx: ToolContext) -> Any:
    """Returns a Python value with no JSON form, as a buggy tool might."""
    await _count(ctx, "odd")
    return {"values": Handle()}
