"""What a test scripts the fake Messages API with: tool_use blocks, a turn of them, a turn calling one
tool, and a live task whose tool call fails for good."""

from __future__ import annotations

import uuid
from typing import Any

from loopwarden.fake_model import FakeModel

SMALL = {"input_tokens": 100, "output_tokens": 10}


def use(
    name: str, args: dict[str, Any], call_id: str | None = None, usage: dict[str, int] | None = None
) -> dict[str, Any]:
    """A tool_use block; ``usage`` rides along for :func:`turn` to drop."""
    return {
        "type": "tool_use",
        "id": call_id or f"toolu_{uuid.uuid4().hex[:8]}",
        "name": name,
        "input": args,
        "_usage": usage,
    }


def turn(*blocks: dict[str, Any], usage: dict[str, int] | None = None) -> dict[str, Any]:
    """A scripted Messages API response made of ``blocks``."""
    return {"content": [{k: v for k, v in b.items() if k != "_usage"} for b in blocks], "usage": usage or SMALL}


def call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """A scripted Messages API response calling one tool."""
    return {
        "content": [{"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:8]}", "name": name, "input": args}],
        "usage": SMALL,
    }


def sql_task(model: FakeModel) -> str:
    """A live task whose tool call fails for good (``fatal``): the run waits for a person."""
    key = f"sql{uuid.uuid4().hex[:10]}"
    call = {"type": "tool_use", "id": "toolu_1", "name": "sql_query", "input": {"query": "select * from nope"}}
    model.script(key, [{"content": [call]}, {"content": [{"type": "text", "text": "no rows"}]}])
    return f"How many orders? [script:{key}]"
