"""The scripted provider is a provider: no wire contract says whether a run is scripted, and the
scripted reply a call gets is chosen from the request alone (so a redelivered call gets the same one)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from shared.messages import ChatMessage
from shared.providers.base import ModelRequest
from shared.providers.scripted import ScriptedProvider
from shared.scenario import parse_scenario

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
SCRIPTED_ONLY = {"scripted", "script_index", "judge_seq"}


def property_names(schema: Any) -> set[str]:
    """Every property name declared anywhere in a JSON Schema document."""
    found: set[str] = set()
    if isinstance(schema, dict):
        props = schema.get("properties")
        if isinstance(props, dict):
            found |= set(props)
        for value in schema.values():
            found |= property_names(value)
    elif isinstance(schema, list):
        for value in schema:
            found |= property_names(value)
    return found


def test_no_command_or_request_contract_carries_a_scripted_only_field() -> None:
    contracts = sorted((SCHEMAS / "messages").glob("*.json"))
    assert len(contracts) > 10, "the generated wire schemas are missing: run make schemas"
    leaks = {}
    for path in contracts:
        names = property_names(json.loads(path.read_text())) & SCRIPTED_ONLY
        if path.stem == "RunSnapshot":
            names -= {"judge_seq"}  # the snapshot's count of judge requests sent, read by progress views
        if names:
            leaks[path.stem] = sorted(names)
    assert leaks == {}, f"scripted-only fields on wire contracts: {leaks}"


def test_the_asyncapi_document_mentions_no_scripted_flag() -> None:
    doc = json.loads((SCHEMAS / "asyncapi.json").read_text())
    assert not property_names(doc) & {"scripted", "script_index"}


def test_a_model_request_has_no_script_index() -> None:
    assert "script_index" not in ModelRequest.model_fields


async def test_a_repeated_request_gets_the_same_scripted_reply_and_the_next_seq_the_next() -> None:
    scenario = parse_scenario({"name": "seq", "task": "t", "planner": [{"text": "first"}, {"text": "second"}]})
    provider = ScriptedProvider(scenario, prompt_caching=False)

    def request(seq: int) -> ModelRequest:
        return ModelRequest(
            purpose="plan", model="claude-sonnet-4-5", system="s", messages=[ChatMessage.user("t")], run_id="r", seq=seq
        )

    first, again, second = [await provider.complete(request(n)) for n in (0, 0, 1)]
    assert (first.text, again.text, second.text) == ("first", "first", "second")
    assert first.id == again.id != second.id
