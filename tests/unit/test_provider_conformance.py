"""One conformance suite every model provider passes: the definition of "a provider works".

Each case is written once, in provider-neutral terms (``Turn``, ``Fail``), and run against every
provider through its real SDK and a local stand-in of its API: scripted (a scenario), anthropic
(the ``anthropic`` SDK against a local Messages API) and openai (the ``openai`` SDK against a local
Chat Completions API). Each call goes through ``complete_with_retry``, the one retry and stop-reason
layer the planner and the judge use. A new provider is a module, its stand-in and a ``Harness`` here.

The scripted provider replays a scenario: it has no stop reasons, HTTP statuses or clocks to
script, so those cases say so and are skipped for it (``Harness.can``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

import pytest
from opentelemetry.trace import NoOpTracer

from shared.backoff import BackoffPolicy
from shared.messages import ChatMessage, TextBlock, ToolResultBlock, ToolUseBlock
from shared.pricing import cost_usd, model_price
from shared.providers.anthropic import STOP_MAP as ANTHROPIC_STOPS
from shared.providers.anthropic import AnthropicProvider
from shared.providers.base import (
    ModelProvider,
    ModelRequest,
    ModelResponse,
    ProviderError,
    StopReason,
    StopReasonError,
    ToolSpec,
    complete_with_retry,
)
from shared.providers.openai import STOP_MAP as OPENAI_STOPS
from shared.providers.openai import OpenAIProvider
from shared.providers.scripted import ScriptedProvider
from shared.scenario import parse_scenario
from tests.support.messages_api import MessagesApiServer
from tests.support.openai_api import ChatCompletionsServer

POLICY = BackoffPolicy(max_attempts=4, base_delay_s=0.01, max_delay_s=0.05, max_elapsed_s=10.0)
TIMEOUT_S = 0.5  # the provider's client timeout in these tests; a "slow" reply takes longer
CALC = ToolSpec(
    name="calculator",
    description="Evaluate an arithmetic expression.",
    input_schema={"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
)


@dataclass
class Turn:
    """A model reply, in our words: ``stop`` is one of ours (answer, length, refusal)."""

    text: str = ""
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    stop: str = ""
    usage: tuple[int, int, int] | None = None  # prompt tokens (all), output tokens, cached prompt tokens
    delay_s: float = 0.0


@dataclass
class Fail:
    status: int
    retry_after_s: float | None = None
    delay_s: float = 0.0


Reply = Turn | Fail


class Harness(Protocol):
    name: str
    model: str
    can: frozenset[str]

    def provider(self) -> ModelProvider: ...
    def script(self, key: str, replies: list[Reply]) -> None: ...
    def sent(self, key: str) -> list[dict[str, Any]]: ...


def raw_words(stop_map: dict[str, StopReason]) -> Mapping[str, str]:
    """The API's first word for each of our stop reasons (scripts are written in ours)."""
    words: dict[str, str] = {}
    for raw, ours in stop_map.items():
        words.setdefault(ours, raw)
    return MappingProxyType(words)


ALL = frozenset({"stop_reasons", "http_errors", "timeouts", "cache"})


class AnthropicHarness:
    name, model, can = "anthropic", "claude-sonnet-4-6", ALL
    STOPS = raw_words(ANTHROPIC_STOPS)

    def __init__(self, api: MessagesApiServer) -> None:
        self.api = api

    def provider(self) -> ModelProvider:
        return AnthropicProvider("test-key", self.api.base_url, TIMEOUT_S, prompt_caching=False)

    def script(self, key: str, replies: list[Reply]) -> None:
        out: list[dict[str, Any]] = []
        for r in replies:
            if isinstance(r, Fail):
                headers = {"retry-after": str(r.retry_after_s)} if r.retry_after_s is not None else {}
                error = {"type": "api_error", "message": f"status {r.status}"}
                out.append({"status": r.status, "headers": headers, "error": error, "delay_s": r.delay_s})
                continue
            content: list[dict[str, Any]] = [{"type": "text", "text": r.text}] if r.text else []
            content += [
                {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:8]}", "name": n, "input": a} for n, a in r.calls
            ]
            reply: dict[str, Any] = {"content": content, "delay_s": r.delay_s}
            if r.stop:
                reply["stop_reason"] = self.STOPS[r.stop]
            if r.usage is not None:
                prompt, output, cached = r.usage
                reply["usage"] = {
                    "input_tokens": prompt - cached,  # the Messages API counts the cache apart
                    "cache_read_input_tokens": cached,
                    "cache_creation_input_tokens": 0,
                    "output_tokens": output,
                }
            out.append(reply)
        self.api.script(key, out)

    def sent(self, key: str) -> list[dict[str, Any]]:
        return self.api.requests[key]


class OpenAIHarness:
    name, model, can = "openai", "gpt-4o", ALL
    STOPS = raw_words(OPENAI_STOPS)

    def __init__(self, api: ChatCompletionsServer) -> None:
        self.api = api

    def provider(self) -> ModelProvider:
        return OpenAIProvider("test-key", self.api.base_url, TIMEOUT_S)

    def script(self, key: str, replies: list[Reply]) -> None:
        out: list[dict[str, Any]] = []
        for r in replies:
            if isinstance(r, Fail):
                headers = {"retry-after": str(r.retry_after_s)} if r.retry_after_s is not None else {}
                error = {"type": "server_error", "message": f"status {r.status}"}
                out.append({"status": r.status, "headers": headers, "error": error, "delay_s": r.delay_s})
                continue
            reply: dict[str, Any] = {
                "content": r.text or None,
                "tool_calls": [{"name": n, "arguments": a} for n, a in r.calls],
                "delay_s": r.delay_s,
            }
            if r.stop == "length" and r.calls:  # cut off mid-arguments, as a real truncated call arrives
                reply["tool_calls"][-1]["arguments"] = '{"expression": "6*'
            if r.stop:
                reply["finish_reason"] = self.STOPS[r.stop]
            if r.usage is not None:
                prompt, output, cached = r.usage
                reply["usage"] = {"prompt_tokens": prompt, "completion_tokens": output, "cached_tokens": cached}
            out.append(reply)
        self.api.script(key, out)

    def sent(self, key: str) -> list[dict[str, Any]]:
        return self.api.requests[key]


class ScriptedHarness:
    name, model, can = "scripted", "claude-sonnet-4-6", frozenset[str]()

    def __init__(self) -> None:
        self.turns: dict[str, list[dict[str, Any]]] = {}
        self.key = ""

    def provider(self) -> ModelProvider:
        return ScriptedProvider(parse_scenario({"name": self.key, "task": "t", "planner": self.turns[self.key]}), False)

    def script(self, key: str, replies: list[Reply]) -> None:
        turns: list[dict[str, Any]] = []
        for r in replies:
            if isinstance(r, Fail):
                turns.append({"error": {"type": "fatal", "message": f"status {r.status}"}})
                continue
            turn: dict[str, Any] = {"text": r.text, "tool_calls": [{"name": n, "input": a} for n, a in r.calls]}
            if r.usage is not None:
                turn["usage"] = {"input_tokens": r.usage[0], "output_tokens": r.usage[1]}
            turns.append(turn)
        self.turns[key], self.key = turns, key

    def sent(self, key: str) -> list[dict[str, Any]]:
        return [{} for _ in self.turns[key]]  # a scenario is not an API: nothing is sent


@pytest.fixture(scope="module")
def messages_api_local() -> Iterator[MessagesApiServer]:
    server = MessagesApiServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def chat_api() -> Iterator[ChatCompletionsServer]:
    server = ChatCompletionsServer().start()
    yield server
    server.stop()


@pytest.fixture(params=["scripted", "anthropic", "openai"])
def harness(
    request: pytest.FixtureRequest, messages_api_local: MessagesApiServer, chat_api: ChatCompletionsServer
) -> Harness:
    if request.param == "anthropic":
        return AnthropicHarness(messages_api_local)
    if request.param == "openai":
        return OpenAIHarness(chat_api)
    return ScriptedHarness()


def needs(h: Harness, capability: str) -> None:
    if capability not in h.can:
        pytest.skip(f"the {h.name} provider has no {capability} to script")


async def turn(
    h: Harness, replies: list[Reply], messages: list[ChatMessage] | None = None
) -> tuple[ModelResponse, str]:
    key = f"c{uuid.uuid4().hex[:10]}"
    h.script(key, replies)
    request = ModelRequest(
        purpose="plan",
        model=h.model,
        system=f"You are a calculator agent. [script:{key}]",
        messages=messages or [ChatMessage.user("What is 6*7?")],
        tools=[CALC],
        max_tokens=256,
        run_id=f"run-{key}",
    )
    return await complete_with_retry(h.provider(), request, POLICY, NoOpTracer()), key


# --- answers ------------------------------------------------------------------------------------


async def test_a_text_answer_is_returned_as_text(harness: Harness) -> None:
    response, _ = await turn(harness, [Turn(text="It is 42.")])
    assert response.text == "It is 42." and response.tool_calls == []
    assert response.stop == "answer"
    assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0
    assert response.id


async def test_a_tool_call_comes_back_with_its_arguments(harness: Harness) -> None:
    response, _ = await turn(harness, [Turn(calls=[("calculator", {"expression": "6*7"})])])
    assert [(c.name, c.input) for c in response.tool_calls] == [("calculator", {"expression": "6*7"})]
    assert response.tool_calls[0].id
    assert response.stop == "tool_calls"


async def test_parallel_tool_calls_come_back_in_order_with_distinct_ids(harness: Harness) -> None:
    calls = [("calculator", {"expression": "6*7"}), ("calculator", {"expression": "2+2"})]
    response, _ = await turn(harness, [Turn(text="Both.", calls=calls)])
    assert [(c.name, c.input) for c in response.tool_calls] == calls
    assert len({c.id for c in response.tool_calls}) == 2
    assert response.text == "Both."


async def test_a_tool_round_trip_is_sent_back_in_the_apis_own_shape(harness: Harness) -> None:
    history = [
        ChatMessage.user("What is 6*7?"),
        ChatMessage(
            role="assistant",
            content=[
                TextBlock(text="Computing."),
                ToolUseBlock(id="call_1", name="calculator", input={"expression": "6*7"}),
            ],
        ),
        ChatMessage(role="user", content=[ToolResultBlock(tool_use_id="call_1", content='{"result": 42}')]),
    ]
    response, key = await turn(harness, [Turn(text="42")], history)
    assert response.text == "42"
    if harness.name == "openai":
        sent = harness.sent(key)[0]["messages"]
        assert sent[0]["role"] == "system"
        assert sent[2]["tool_calls"][0]["function"] == {"name": "calculator", "arguments": '{"expression": "6*7"}'}
        assert sent[3] == {"role": "tool", "tool_call_id": "call_1", "content": '{"result": 42}'}
        assert harness.sent(key)[0]["tools"][0]["function"]["parameters"] == CALC.input_schema
    if harness.name == "anthropic":
        sent = harness.sent(key)[0]["messages"]
        assert sent[2]["content"][0] == {
            "type": "tool_result",
            "tool_use_id": "call_1",
            "content": '{"result": 42}',
            "is_error": False,
        }


# --- usage and cost -----------------------------------------------------------------------------


async def test_usage_is_the_providers_count_priced_by_the_table(harness: Harness) -> None:
    response, _ = await turn(harness, [Turn(text="ok", usage=(1000, 20, 0))])
    u = response.usage
    assert (u.input_tokens, u.output_tokens, u.cache_read_input_tokens) == (1000, 20, 0)
    assert u.cost_usd == cost_usd(harness.model, 1000, 20)


async def test_cached_prompt_tokens_are_part_of_the_prompt_and_billed_at_the_cached_rate(harness: Harness) -> None:
    needs(harness, "cache")
    response, _ = await turn(harness, [Turn(text="ok", usage=(4000, 10, 3072))])
    u = response.usage
    assert u.input_tokens == 4000 and u.cache_read_input_tokens == 3072 and u.cache_creation_input_tokens == 0
    p = model_price(harness.model)
    expected = (928 * p.input + 3072 * p.cache_read + 10 * p.output) / 1_000_000
    assert u.cost_usd == pytest.approx(expected)
    assert p.cache_read < p.input


async def test_usage_without_a_script_is_counted_from_the_request(harness: Harness) -> None:
    response, _ = await turn(harness, [Turn(text="ok")])
    assert response.usage.input_tokens >= 20  # the system prompt, the task and the tool's schema
    assert response.usage.cost_usd > 0


# --- stop reasons -------------------------------------------------------------------------------


async def test_a_cut_off_reply_gets_one_call_with_more_room(harness: Harness) -> None:
    needs(harness, "stop_reasons")
    replies: list[Reply] = [
        Turn(text="The answer is", calls=[("calculator", {"expression": "6*7"})], stop="length", usage=(100, 256, 0)),
        Turn(calls=[("calculator", {"expression": "6*7"})], usage=(100, 20, 0)),
    ]
    response, key = await turn(harness, replies)
    sent = harness.sent(key)
    assert len(sent) == 2
    room = [r.get("max_tokens") or r.get("max_completion_tokens") for r in sent]
    assert room == [256, 512]
    assert sent[1]["messages"] == sent[0]["messages"]  # the cut-off reply is dropped, not continued
    assert [c.input for c in response.tool_calls] == [{"expression": "6*7"}]  # only the complete call
    assert response.usage.input_tokens == 200  # both calls were billed


async def test_cut_off_twice_is_a_typed_failure_and_no_call_is_returned(harness: Harness) -> None:
    needs(harness, "stop_reasons")
    cut = Turn(calls=[("calculator", {"expression": "6*7"})], stop="length", usage=(100, 256, 0))
    with pytest.raises(StopReasonError) as raised:
        await turn(harness, [cut, cut])
    assert raised.value.kind == "max_tokens" and not raised.value.transient
    assert raised.value.usage.input_tokens == 200


async def test_a_refusal_or_content_filter_is_a_typed_refusal(harness: Harness) -> None:
    needs(harness, "stop_reasons")
    with pytest.raises(StopReasonError) as raised:
        await turn(harness, [Turn(text="I can't help with that.", stop="refusal")])
    assert raised.value.kind == "refusal"


# --- errors, retries, timeouts ------------------------------------------------------------------


async def test_429_and_5xx_are_retried_by_our_layer_honouring_retry_after(harness: Harness) -> None:
    needs(harness, "http_errors")
    response, key = await turn(harness, [Fail(429, retry_after_s=0.05), Fail(503), Turn(text="ok")])
    assert response.text == "ok"
    assert len(harness.sent(key)) == 3


async def test_a_client_error_is_not_retried(harness: Harness) -> None:
    with pytest.raises(ProviderError) as raised:
        await turn(harness, [Fail(401), Turn(text="never")])
    assert not raised.value.transient
    if "http_errors" in harness.can:
        assert raised.value.kind == "http_401" and "HTTP 401" in str(raised.value)
        assert len(harness.sent(raised_key(harness))) == 1


async def test_a_slow_reply_times_out_and_is_retried(harness: Harness) -> None:
    needs(harness, "timeouts")
    response, key = await turn(harness, [Turn(text="late", delay_s=TIMEOUT_S * 3), Turn(text="in time")])
    assert response.text == "in time"
    assert len(harness.sent(key)) == 2


async def test_retries_give_up_as_a_transient_provider_error(harness: Harness) -> None:
    needs(harness, "http_errors")
    with pytest.raises(ProviderError) as raised:
        await turn(harness, [Fail(500)] * POLICY.max_attempts)
    assert raised.value.transient and raised.value.kind == "server_error"


def raised_key(h: Harness) -> str:
    """The key of the last script (the request that raised): the stand-ins record each key's requests."""
    api: MessagesApiServer | ChatCompletionsServer = h.api  # type: ignore[attr-defined]
    return list(api.requests)[-1]
