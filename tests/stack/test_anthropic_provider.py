"""The anthropic provider through the real SDK, against a local server speaking the Messages API."""

from __future__ import annotations

import json
import uuid

from loopwarden.client import Client
from loopwarden.fake_model import FakeModel
from shared.messages import Rubric, RunSubmit
from tests.support.timing import bound

USAGE = {"input_tokens": 100, "output_tokens": 10}


def tool_use(name: str, args: dict, id_: str) -> dict:
    return {"type": "tool_use", "id": id_, "name": name, "input": args}


async def test_tool_loop_through_the_sdk(client: Client, messages_api: FakeModel) -> None:
    key = f"k{uuid.uuid4().hex[:8]}"
    messages_api.script(
        key,
        [
            {"status": 429, "headers": {"retry-after": "0.1"}},  # rate limited: retried once, by us
            {
                "content": [
                    {"type": "text", "text": "Computing."},
                    tool_use("calculator", {"expr": "6*7"}, "toolu_a1"),
                ],
                "usage": USAGE,
            },
            {"content": [tool_use("calculator", {"expression": "6*7"}, "toolu_a2")], "usage": USAGE},
            {"content": [tool_use("submit_result", {"answer": "6*7 = 42"}, "toolu_a3")], "usage": USAGE},
            {
                "content": [{"type": "text", "text": json.dumps({"scores": {"correct": 1.0}, "reasons": {}})}],
                "usage": {"input_tokens": 50, "output_tokens": 5},
            },  # the judge, through the same SDK
        ],
    )
    run_id = f"run-anth-{key}"
    await client.submit(
        RunSubmit(
            run_id=run_id,
            task=f"What is 6*7? [script:{key}]",
            rubric=Rubric(criteria=[{"name": "correct"}], threshold=0.5),
            # its tools named: whatever else other tests registered on this stack, the catalogue stays
            # under progressive disclosure's threshold, so the tools are offered whole (asserted below)
            tools=["calculator"],
        )
    )
    state = await client.wait(run_id, timeout=bound(60))
    assert state.status == "completed", state.final_reason
    assert state.final_output == "6*7 = 42"
    assert state.passed is True

    reqs = messages_api.requests[key]
    assert len(reqs) == 5  # 429, three planner turns, one judge call
    # the SDK's own retries are off: each attempt is a fresh call from our retry layer
    retry_counts = {h.get("x-stainless-retry-count") for h in messages_api.headers[key]}
    assert retry_counts <= {None, "0"}
    # tools were offered with their (closed) input schemas
    offered = {t["name"]: t for t in reqs[1]["tools"]}
    assert offered["calculator"]["input_schema"]["additionalProperties"] is False
    # the bad call came back as an is_error tool_result with the errors and the schema
    error_result = reqs[2]["messages"][-1]["content"][0]
    assert error_result["type"] == "tool_result" and error_result["tool_use_id"] == "toolu_a1"
    assert error_result["is_error"] is True
    assert "missing required field 'expression'" in error_result["content"]
    assert "unexpected field(s) 'expr'" in error_result["content"]
    assert '"pattern"' in error_result["content"]  # the schema itself is included
    ok_result = reqs[3]["messages"][-1]["content"][0]
    assert ok_result["is_error"] is False and json.loads(ok_result["content"])["result"] == 42
    # the conversation never ends on an assistant turn (no accidental prefill)
    assert all(r["messages"][-1]["role"] == "user" for r in reqs[1:4])
    # usage comes from the responses: three planner turns at 100/10 (the judge is billed to the judge)
    assert state.usage.input_tokens == 300 and state.usage.output_tokens == 30


async def test_overloaded_then_fatal_provider_errors(client: Client, messages_api: FakeModel) -> None:
    key = f"k{uuid.uuid4().hex[:8]}"
    messages_api.script(
        key,
        [
            {"status": 529, "error": {"type": "overloaded_error", "message": "Overloaded"}},
            {"status": 401, "error": {"type": "authentication_error", "message": "invalid x-api-key"}},
        ],
    )
    run_id = f"run-anth-{key}"
    await client.submit(RunSubmit(run_id=run_id, task=f"Anything. [script:{key}]"))
    state = await client.wait(run_id, timeout=bound(60))
    assert state.status == "failed"
    assert "HTTP 401" in (state.final_reason or "")  # not retried: a fatal error fails the run at once
    assert len(messages_api.requests[key]) == 2
