"""The OpenAI-compatible provider on a real stack, and the undeclared-field policy end to end.

One stack for the module: the planner on the ``openai`` provider (the real ``openai`` SDK against a
local Chat Completions server), the judge on ``anthropic`` (the real ``anthropic`` SDK against a
local Messages API), and three tools imported from ecosystem definitions (OpenAI function format,
Anthropic tool format), one per undeclared-field policy.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from loopwarden.client import Client
from loopwarden.progress import render
from loopwarden.records import export_run
from loopwarden.runtree import build, step_detail
from loopwarden.stack import LocalStack
from shared.messages import Rubric, RunSnapshot, RunSubmit
from tests.support.messages_api import MessagesApiServer
from tests.support.openai_api import ChatCompletionsServer
from tests.support.otlp_collector import OtlpCollector
from tests.support.paths import ROOT
from tests.support.stacks import ONE_EACH, TEST_ENV, running, settings_for
from tests.support.timing import bound, polls

TOOLS = ROOT / "tests" / "ecosystem_tools"


@pytest.fixture(scope="module")
def chat_api() -> Iterator[ChatCompletionsServer]:
    server = ChatCompletionsServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def judge_api() -> Iterator[MessagesApiServer]:
    server = MessagesApiServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def metrics() -> Iterator[OtlpCollector]:
    collector = OtlpCollector().start()
    yield collector
    collector.stop()


@pytest.fixture(scope="module")
def mixed(
    tmp_path_factory: pytest.TempPathFactory,
    chat_api: ChatCompletionsServer,
    judge_api: MessagesApiServer,
    metrics: OtlpCollector,
) -> Iterator[LocalStack]:
    env = {
        **{k: v for k, v in TEST_ENV.items() if k != "ANTHROPIC_API_KEY"},
        "OTEL_EXPORTER_OTLP_ENDPOINT": metrics.endpoint,
        "LW_PLANNER_PROVIDER": "openai",
        "LW_PLANNER_MODEL": "gpt-4o",
        "LW_FALLBACK_MODEL": "gpt-4o-mini",
        "LW_PLANNER_BASE_URL": chat_api.base_url,
        "LW_PLANNER_API_KEY": "planner-key-not-real",
        "LW_JUDGE_PROVIDER": "anthropic",
        "LW_JUDGE_MODEL": "claude-haiku-4-5",
        "LW_JUDGE_BASE_URL": judge_api.base_url,
        "LW_JUDGE_API_KEY": "judge-key-not-real",
        "LW_TOOL_CONTRACT_DIR": str(TOOLS),
    }
    yield from running(
        LocalStack(
            state_dir=tmp_path_factory.mktemp("openai"),
            nats_url=os.environ.get("LW_TEST_NATS_URL"),
            env=env,
            services=ONE_EACH,
        )
    )


@pytest.fixture
async def mixed_client(mixed: LocalStack) -> AsyncIterator[Client]:
    async with Client(settings_for(mixed)) as c:
        yield c


def call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": args}], "usage": {"prompt_tokens": 100, "completion_tokens": 10}}


async def run(
    client: Client, chat_api: ChatCompletionsServer, replies: list[dict[str, Any]], **submit: Any
) -> tuple[RunSnapshot, str]:
    key = f"o{uuid.uuid4().hex[:8]}"
    chat_api.script(key, replies)
    run_id = f"run-oai-{key}"
    await client.submit(RunSubmit(run_id=run_id, task=f"Book flight LW1. [script:{key}]", **submit))
    return await client.wait(run_id, timeout=bound(30)), key


def header(headers: dict[str, str], name: str) -> str | None:
    return next((v for k, v in headers.items() if k.lower() == name), None)


def tool_messages(chat_api: ChatCompletionsServer, key: str) -> list[dict[str, Any]]:
    """The tool results the planner sent back to the model, in order, from its last request."""
    return [m for m in chat_api.requests[key][-1]["messages"] if m["role"] == "tool"]


async def test_a_live_run_with_the_planner_on_openai_and_the_judge_on_anthropic(
    mixed_client: Client, chat_api: ChatCompletionsServer, judge_api: MessagesApiServer
) -> None:
    key_replies: list[dict[str, Any]] = [
        {"status": 429, "headers": {"retry-after": "0.05"}},  # retried by our layer, not the SDK's
        {  # parallel tool calls in one turn
            "content": "Computing both.",
            "tool_calls": [
                {"name": "calculator", "arguments": {"expression": "6*7"}},
                {"name": "calculator", "arguments": {"expression": "2+2"}},
            ],
            "usage": {"prompt_tokens": 2000, "completion_tokens": 20, "cached_tokens": 1024},
        },
        call("submit_result", {"answer": "6*7 = 42 and 2+2 = 4"}),
    ]
    key = f"o{uuid.uuid4().hex[:8]}"
    chat_api.script(key, key_replies)
    judge_api.script(
        key,
        [
            {
                "content": [{"type": "text", "text": json.dumps({"scores": {"correct": 1.0}, "reasons": {}})}],
                "usage": {"input_tokens": 50, "output_tokens": 5},
            }
        ],
    )
    run_id = f"run-oai-{key}"
    await mixed_client.submit(
        RunSubmit(
            run_id=run_id,
            task=f"What are 6*7 and 2+2? [script:{key}]",
            rubric=Rubric(criteria=[{"name": "correct"}], threshold=0.5),
        )
    )
    state = await mixed_client.wait(run_id, timeout=bound(30))
    assert state.status == "completed", state.final_reason
    assert state.final_output == "6*7 = 42 and 2+2 = 4"
    assert state.passed is True

    planner_calls = chat_api.requests[key]
    assert len(planner_calls) == 3  # the 429, then two turns: the planner spoke only to the OpenAI server
    assert {header(h, "authorization") for h in chat_api.headers[key]} == {"Bearer planner-key-not-real"}
    assert {h.get("x-stainless-retry-count") for h in chat_api.headers[key]} <= {None, "0"}
    assert planner_calls[1]["model"] == "gpt-4o" and planner_calls[1]["parallel_tool_calls"] is True
    offered = {t["function"]["name"] for t in planner_calls[1]["tools"]}
    assert {"calculator", "submit_result"} <= offered
    results = tool_messages(chat_api, key)
    assert [json.loads(m["content"])["result"] for m in results] == [42, 4]  # both parallel calls ran
    assert len(judge_api.requests[key]) == 1  # the judge spoke only to the Messages API
    assert judge_api.requests[key][0]["model"] == "claude-haiku-4-5"
    assert {header(h, "authorization") for h in judge_api.headers[key]} == {"Bearer judge-key-not-real"}
    # usage as the provider reported it; cached prompt tokens are part of the prompt, at the cached rate
    assert state.usage.input_tokens == 2100 and state.usage.cache_read_input_tokens == 1024


async def test_a_cut_off_openai_reply_is_retried_with_more_room_and_its_truncated_call_never_runs(
    mixed_client: Client, chat_api: ChatCompletionsServer
) -> None:
    truncated = {
        "tool_calls": [{"name": "book_strip", "arguments": '{"flight": "LW'}],
        "finish_reason": "length",
        "usage": {"prompt_tokens": 100, "completion_tokens": 10},
    }
    state, key = await run(mixed_client, chat_api, [truncated, truncated])
    assert state.status == "failed"
    assert "model turn unusable (max_tokens)" in (state.final_reason or "")
    reqs = chat_api.requests[key]
    assert len(reqs) == 2 and reqs[1]["max_completion_tokens"] >= 2 * reqs[0]["max_completion_tokens"]
    assert state.usage.input_tokens == 200  # both calls billed
    assert not [e for e in await mixed_client.events(state.run_id) if e.kind.startswith("tool.")]


# --- undeclared input fields: each policy, end to end -------------------------------------------

INVENTED = {"flight": "LW1", "seat": "12A", "meal": "vegan"}  # two fields the schema does not declare


async def test_refuse_tells_the_model_and_never_runs_the_call(
    mixed_client: Client, chat_api: ChatCompletionsServer
) -> None:
    state, key = await run(
        mixed_client,
        chat_api,
        [
            call("book_refuse", INVENTED),
            call("book_refuse", {"flight": "LW1"}),
            call("submit_result", {"answer": "booked"}),
        ],
    )
    assert state.status == "completed", state.final_reason
    first, second = tool_messages(chat_api, key)
    assert "unexpected field(s) 'meal', 'seat'" in first["content"]  # the model is told and may correct
    assert json.loads(second["content"])["received"] == {"flight": "LW1"}  # only the corrected call ran


async def test_strip_removes_the_fields_and_runs_the_call(
    mixed: LocalStack, mixed_client: Client, chat_api: ChatCompletionsServer
) -> None:
    state, key = await run(
        mixed_client, chat_api, [call("book_strip", INVENTED), call("submit_result", {"answer": "booked"})]
    )
    assert state.status == "completed", state.final_reason
    (result,) = tool_messages(chat_api, key)
    assert json.loads(result["content"])["received"] == {"flight": "LW1"}
    # the repair is visible in the run: its event (as `loopwarden events` prints it), the record, the tree
    (succeeded,) = [e for e in await mixed_client.events(state.run_id) if e.kind == "tool.succeeded.book_strip"]
    assert succeeded.payload["stripped"] == ["/meal", "/seat"]
    assert succeeded.payload["repaired"] is True and succeeded.payload["arguments"] == {"flight": "LW1"}
    assert succeeded.payload["repairs"] == [
        "undeclared input field /meal stripped",
        "undeclared input field /seat stripped",
    ]
    line = render(succeeded) or ""
    assert "undeclared input stripped: /meal, /seat" in line and "output repaired" not in line
    record = await export_run(mixed_client.bus, settings_for(mixed), state.run_id)
    (booked,) = [t for t in record.tool_calls if t.tool == "book_strip"]
    assert booked.arguments == {"flight": "LW1"} and (booked.outcome or {}).get("stripped") == ["/meal", "/seat"]
    (step,) = [s for _, s in build(record).walk() if s.kind == "tool" and s.title == "book_strip"]
    assert step.status == "repaired" and "stripped /meal, /seat" in step.summary
    assert [(c.title, c.status, c.summary) for c in step.children if c.kind == "validation"] == [
        ("input validation", "repaired", "stripped undeclared field(s) /meal, /seat")
    ]
    opened = {sec.key: sec.text for sec in step_detail(record, step.id)}
    assert "undeclared input field /seat stripped" in opened["repairs"]


async def test_open_honours_the_schema_as_written(mixed_client: Client, chat_api: ChatCompletionsServer) -> None:
    state, key = await run(
        mixed_client, chat_api, [call("book_open", INVENTED), call("submit_result", {"answer": "booked"})]
    )
    assert state.status == "completed", state.final_reason
    (result,) = tool_messages(chat_api, key)
    assert json.loads(result["content"])["received"] == INVENTED


async def test_strip_still_refuses_a_call_that_is_wrong_otherwise(
    mixed_client: Client, chat_api: ChatCompletionsServer
) -> None:
    state, key = await run(
        mixed_client,
        chat_api,
        [
            call("book_strip", {"seat": "12A"}),
            call("book_strip", {"flight": "LW1"}),
            call("submit_result", {"answer": "ok"}),
        ],
    )
    assert state.status == "completed", state.final_reason
    first, _ = tool_messages(chat_api, key)
    assert "missing required field 'flight'" in first["content"]


async def test_the_metrics_count_undeclared_fields_per_tool_and_outcome(
    mixed_client: Client, chat_api: ChatCompletionsServer, metrics: OtlpCollector
) -> None:
    for tool in ("book_refuse", "book_strip", "book_open"):
        replies = [call(tool, INVENTED), call("submit_result", {"answer": "booked"})]
        if tool == "book_refuse":
            replies.insert(1, call(tool, {"flight": "LW1"}))
        await run(mixed_client, chat_api, replies)
    wanted = {("book_refuse", "refuse", "refused"), ("book_strip", "strip", "stripped"), ("book_open", "open", "kept")}
    seen: set[tuple[Any, Any, Any]] = set()
    for _ in range(polls(80)):  # metrics export every 5 s
        points = metrics.metrics.get(("loopwarden-executor", "loopwarden.tool.undeclared_fields"), [])
        seen = {(p.get("tool"), p.get("policy"), p.get("outcome")) for p in points}
        if wanted <= seen:
            break
        await asyncio.sleep(0.25)
    assert wanted <= seen
    # a call without undeclared fields is not counted
    assert not any(
        p.get("tool") == "calculator"
        for p in metrics.metrics.get(("loopwarden-executor", "loopwarden.tool.undeclared_fields"), [])
    )
