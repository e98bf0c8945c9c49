"""What is stored of a message (``shared.messages.lean``): its defaults left out, its tags kept, read back the same;
and a left-out field is one the last release's readers fill with the same default."""

from __future__ import annotations

import json
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field

from loopwarden.generate.compat import RELEASES, SCHEMAS, releases
from services.executor.ledger import LedgerEntry
from services.governor.budget import BudgetLedger
from services.planner import turns
from services.planner.state import Iteration, RunState
from shared.messages import ChatMessage, ModelCalled, ModelCalledDetail, RunSubmit, ToolOutcome, Usage
from shared.messages.lean import kept_fields, lean_json
from shared.settings import Settings


class Block(BaseModel):
    type: Literal["text"] = "text"
    text: str


class Inner(BaseModel):
    n: int = 0
    note: str | None = None


class Outer(BaseModel):
    name: str
    mode: str = "auto"  # a non-empty string default: kept
    count: int = 0
    flag: bool = False
    retried: bool = True  # a default that says something: kept
    attempts: int = 1
    ratio: float = 0.0
    items: list[str] = Field(default_factory=list)
    inner: Inner = Field(default_factory=Inner)
    blocks: list[Block] = Field(default_factory=list)  # holds a tag below: kept whole
    alias_: str | None = Field(None, alias="alias")


def test_defaults_are_left_out_and_tags_and_string_defaults_kept() -> None:
    assert kept_fields(Outer) == {"mode", "retried", "attempts", "inner", "blocks"}  # inner: a model by default
    # a kept model is written lean in turn; a list holding a tag below it, whole
    assert lean_json(Outer(name="x")) == '{"name":"x","inner":{},"mode":"auto","retried":true,"attempts":1,"blocks":[]}'
    full = Outer(name="x", count=2, flag=True, inner=Inner(n=1), blocks=[Block(text="t")], alias="a")
    text = lean_json(full)
    assert json.loads(text) == {
        "name": "x",
        "count": 2,
        "flag": True,
        "inner": {"n": 1},
        "alias": "a",
        "mode": "auto",
        "retried": True,
        "attempts": 1,
        "blocks": [{"type": "text", "text": "t"}],
    }
    assert Outer.model_validate_json(text) == full


def _samples() -> list[BaseModel]:
    usage = Usage(input_tokens=3, output_tokens=1, cost_usd=0.1)
    return [
        ModelCalled(run_id="run-1", detail=ModelCalledDetail(input_tokens=1, output_tokens=2, cost_usd=0.0, model="m")),
        ToolOutcome(
            run_id="run-1",
            iteration=1,
            call_id="c1",
            attempt_id="run-1.i1.c1",
            tool="t",
            requested_tool="t",
            success=True,
            data={"a": None, "b": []},  # a value's own nulls and empties are the value: kept
        ),
        RunSubmit(run_id="run-1", task="t"),
        ChatMessage.user("hello"),
        RunState(
            run_id="run-1",
            task="t",
            config=turns.resolve_config(RunSubmit(run_id="run-1", task="t"), Settings(), {}),
            iteration=Iteration(n=1),
            model="m",
            messages=[ChatMessage.user("t")],
            usage=usage,
        ),
        LedgerEntry(attempt_id="run-1.i1.c1", tool="t", idempotent=True),
        BudgetLedger(run_id="run-1"),
    ]


@pytest.mark.parametrize("message", _samples(), ids=lambda m: type(m).__name__)
def test_what_is_stored_reads_back_as_the_message_and_is_no_larger(message: BaseModel) -> None:
    text = lean_json(message)
    back = type(message).model_validate_json(text)
    assert back.model_dump() == message.model_dump()
    assert len(text) <= len(message.model_dump_json(by_alias=True))


def test_a_chat_message_keeps_its_content_blocks_tags() -> None:
    assert json.loads(lean_json(ChatMessage.user("hi")))["content"] == [{"type": "text", "text": "hi"}]
    assert '"data":{"a":null,"b":[]}' in lean_json(_samples()[1])


# --- against the last release ---------------------------------------------------------------------------------


def _objects(schema: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every object schema of a contract by name: the contract's own and those of its ``$defs``."""
    out = {str(schema.get("title", "")): schema}
    out.update(schema.get("$defs", {}))
    return out


def test_a_field_left_out_at_its_default_is_one_the_last_release_reads_with_the_same_default() -> None:
    """A writer of this tree leaves out what holds its default; a reader of the last release fills it in with its
    own. So no such field may be one the last release requires, nor have another default there."""
    last = RELEASES / releases()[-1] / "messages"
    problems = []
    for path in sorted((SCHEMAS / "messages").glob("*.json")):
        old_path = last / path.name
        if path.name == "catalogue.json" or not old_path.exists():
            continue  # a contract the last release does not know: it reads none
        now, then = _objects(json.loads(path.read_text())), _objects(json.loads(old_path.read_text()))
        for name, obj in now.items():
            old = then.get(name)
            if old is None:
                continue
            required_now = set(obj.get("required", []))
            for prop, spec in (obj.get("properties") or {}).items():
                if prop in required_now:
                    continue  # always written
                old_spec = (old.get("properties") or {}).get(prop)
                if old_spec is None:
                    continue  # a field the last release ignores
                if prop in old.get("required", []):
                    problems.append(f"{path.stem}/{name}.{prop}: required by the last release, left out at its default")
                elif "default" in spec and "default" in old_spec and spec["default"] != old_spec["default"]:
                    problems.append(
                        f"{path.stem}/{name}.{prop}: default {old_spec['default']!r} -> {spec['default']!r}"
                    )
    assert problems == [], "\n".join(problems)
