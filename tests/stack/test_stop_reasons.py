"""Every stop reason handled explicitly, through the real SDK against the local Messages-API server:
max_tokens gets one call with more room then a typed failure, a refusal stops the run, pause_turn is
continued, a full context window fails typed, and 408/409 are retried like the SDK itself would."""

from __future__ import annotations

import uuid
from typing import Any

from loopwarden.client import Client
from loopwarden.fake_model import FakeModel
from shared.messages import RunSubmit
from tests.support.timing import bound

USAGE = {"input_tokens": 100, "output_tokens": 10}


def submit(answer: str) -> dict[str, Any]:
    return {
        "content": [
            {
                "type": "tool_use",
                "id": f"toolu_{uuid.uuid4().hex[:6]}",
                "name": "submit_result",
                "input": {"answer": answer},
            }
        ],
        "usage": USAGE,
    }


def text(t: str, stop: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": t}], "stop_reason": stop, "usage": USAGE}


async def run(client: Client, api: FakeModel, replies: list[dict[str, Any]]) -> tuple[Any, list[dict], str]:
    key = f"s{uuid.uuid4().hex[:8]}"
    api.script(key, replies)
    run_id = f"run-stop-{key}"
    await client.submit(RunSubmit(run_id=run_id, task=f"Answer briefly. [script:{key}]"))
    return await client.wait(run_id, timeout=bound(60)), api.requests[key], run_id


async def test_max_tokens_gets_one_call_with_more_room(client: Client, messages_api: FakeModel) -> None:
    state, reqs, _ = await run(client, messages_api, [text("The answer is a very long", "max_tokens"), submit("42")])
    assert state.status == "completed", state.final_reason
    assert state.final_output == "42"
    assert len(reqs) == 2
    first, second = reqs[0]["max_tokens"], reqs[1]["max_tokens"]
    assert second >= 2 * first  # more room, same conversation
    assert second == max(8192, 2 * first)
    assert reqs[1]["messages"] == reqs[0]["messages"]
    assert state.usage.input_tokens == 200 and state.model_calls == 1  # both calls were billed to the run


async def test_max_tokens_twice_is_a_typed_failure(client: Client, messages_api: FakeModel) -> None:
    state, reqs, run_id = await run(client, messages_api, [text("cut", "max_tokens"), text("cut again", "max_tokens")])
    assert len(reqs) == 2
    assert state.status == "failed"
    assert "model turn unusable (max_tokens)" in (state.final_reason or "")
    stops = [e for e in await client.events(run_id) if e.kind == "run.model_stopped"]
    assert [e.payload["detail"]["stop_reason"] for e in stops] == ["max_tokens"]
    assert state.usage.input_tokens == 200  # billed though unusable


async def test_a_refusal_stops_the_run_and_is_not_retried(client: Client, messages_api: FakeModel) -> None:
    state, reqs, run_id = await run(client, messages_api, [text("I can't help with that.", "refusal")])
    assert len(reqs) == 1
    assert state.status == "stopped"
    assert (state.final_reason or "").startswith("refused by the model")
    stops = [e.payload["detail"]["stop_reason"] for e in await client.events(run_id) if e.kind == "run.model_stopped"]
    assert stops == ["refusal"]
    assert not (await client.escalations(run_id=run_id)).escalations


async def test_pause_turn_is_continued(client: Client, messages_api: FakeModel) -> None:
    state, reqs, _ = await run(client, messages_api, [text("Working on it...", "pause_turn"), submit("done")])
    assert state.status == "completed", state.final_reason
    assert len(reqs) == 2
    # the paused turn goes back as the assistant's partial reply, for the model to continue
    assert reqs[1]["messages"][-1]["role"] == "assistant"
    assert reqs[1]["messages"][-1]["content"][0]["text"] == "Working on it..."


async def test_a_full_context_window_fails_typed(client: Client, messages_api: FakeModel) -> None:
    state, _, _ = await run(client, messages_api, [text("", "model_context_window_exceeded")])
    assert state.status == "failed"
    assert "model turn unusable (context_window_exceeded)" in (state.final_reason or "")


async def test_408_and_409_are_transient(client: Client, messages_api: FakeModel) -> None:
    state, reqs, _ = await run(
        client,
        messages_api,
        [
            {"status": 408, "error": {"type": "timeout_error", "message": "Request timed out"}},
            {"status": 409, "error": {"type": "conflict_error", "message": "lock conflict"}},
            submit("ok"),
        ],
    )
    assert state.status == "completed", state.final_reason
    assert len(reqs) == 3
