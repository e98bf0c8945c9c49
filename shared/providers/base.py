"""The model interface the planner and the judge call, and the one retry loop around it."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal, Protocol, assert_never

from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer
from pydantic import BaseModel, Field

from shared import telemetry as T
from shared.backoff import BackoffPolicy, next_delay
from shared.messages import ChatMessage, TextBlock, ToolUseBlock, Usage


class ToolSpec(BaseModel):
    name: str
    description: str
    input_schema: dict[str, Any]


class ModelRequest(BaseModel):
    purpose: Literal["plan", "judge", "summarize"]
    model: str
    system: str
    messages: list[ChatMessage]
    tools: list[ToolSpec] = Field(default_factory=list)
    max_tokens: int = 1024
    run_id: str = ""
    seq: int = Field(
        0,
        ge=0,
        description="this run's n-th call for this purpose (0 first), the same when a call is repeated on a "
        "redelivery: a provider keys a deterministic reply or an idempotency key by it",
    )
    cache: bool = Field(False, description="may be sent with prompt-cache breakpoints (planner turns)")


class ModelResponse(BaseModel):
    text: str = ""
    tool_calls: list[ToolUseBlock] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    model: str = ""
    stop: StopReason = Field("answer", description="why the model stopped, in our words")
    stop_reason: str = Field("", description="the provider's own word for it, as it sent it (spans, events)")
    id: str = Field("", description="the provider's id for this response (gen_ai.response.id)")
    rate_limit_wait_s: float = Field(0.0, description="how long the call waited for its key's rate limit")
    headers: dict[str, str] = Field(
        default_factory=dict, exclude=True, description="the answer's rate-limit headers (never stored)"
    )


class ProviderError(Exception):
    """A model call failed. ``transient`` errors (rate limit, overload, 5xx, timeouts) are
    retried by ``complete_with_retry``; the rest fail the call at once."""

    def __init__(
        self,
        message: str,
        *,
        transient: bool,
        retry_after_s: float | None = None,
        kind: str = "error",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.transient = transient
        self.retry_after_s = retry_after_s
        self.kind = kind
        self.headers = headers or {}  # the answer's rate-limit headers, when there was an answer


class StopReasonError(ProviderError):
    """The model stopped for a reason that is not an answer: cut off at ``max_tokens`` even after a
    continuation with more room, a ``refusal``, a full context window, or a stop reason we do not know.
    ``usage`` is what the call(s) cost: they were billed even though they produced nothing usable."""

    def __init__(self, message: str, *, kind: str, usage: Usage, text: str = "") -> None:
        super().__init__(message, transient=False, kind=kind)
        self.usage = usage
        self.text = text


# Our own stop vocabulary: each provider maps its API's words onto it (``stop_map`` in its module),
# and ``complete_with_retry`` dispatches on it alone, so a new provider is a new map, not a new branch.
StopReason = Literal["answer", "tool_calls", "length", "paused", "refusal", "context_full", "unknown"]
MAX_PAUSE_CONTINUATIONS = 2


def map_stop(stop_map: dict[str, StopReason], raw: str | None) -> StopReason:
    """A provider's raw stop reason in our words: an empty one is a normal answer, one the map does not
    know is ``unknown`` (a typed failure, never a silent default)."""
    if not raw:
        return "answer"
    return stop_map.get(raw, "unknown")


class ScriptExhausted(ProviderError):
    def __init__(self, message: str) -> None:
        super().__init__(message, transient=False, kind="script_exhausted")


class ModelProvider(Protocol):
    name: str

    async def complete(self, request: ModelRequest) -> ModelResponse: ...


class CallGate(Protocol):
    """What a model call waits on before each attempt and reports to after it: the fleet's rate limit
    for the provider's key (``shared/ratelimit/gate.py``). ``before`` returns a ticket for ``after`` (or
    raises a non-transient ``ProviderError`` when the wait would pass its bound); ``after`` returns True
    when the attempt's error was a 429 the gate paused the key for: the call is sent again through
    ``before``, not retried with backoff."""

    waited_s: float

    async def before(self, request: ModelRequest) -> object: ...

    async def after(
        self, ticket: object, response: ModelResponse | None = None, error: ProviderError | None = None
    ) -> bool: ...


async def complete_with_retry(
    provider: ModelProvider,
    request: ModelRequest,
    policy: BackoffPolicy,
    tracer: Tracer,
    metrics: T.GenAiMetrics | None = None,
    *,
    more_room_tokens: int | None = None,
    gate: CallGate | None = None,
) -> ModelResponse:
    """One model turn: ``call_with_retry``, with every stop reason handled explicitly.

    * ``answer``, ``tool_calls``: the answer.
    * ``length``: the reply was cut off (a truncated tool call cannot run): asked once more with
      more room (``more_room_tokens``, default twice the budget); cut off again -> ``StopReasonError``.
    * ``paused``: the partial turn is sent back so the model continues it (at most twice).
    * ``refusal``, ``context_full`` and ``unknown``: ``StopReasonError``.
    The usage of every call made is summed into the result (or the error): each was billed.
    ``gate``: each attempt waits for the provider key's rate limit first (``CallGate``).
    """
    response = await call_with_retry(provider, request, policy, tracer, metrics, gate)
    spent = response.usage
    pauses = 0
    while True:
        stop = response.stop
        raw = response.stop_reason or stop
        match stop:
            case "answer" | "tool_calls":
                return response.model_copy(update={"usage": spent})
            case "length":
                room = max(more_room_tokens or 0, request.max_tokens * 2)
                request = request.model_copy(update={"max_tokens": room})
                # the cut-off reply (maybe a truncated tool call) is dropped, never executed
                response = await call_with_retry(provider, request, policy, tracer, metrics, gate)
                spent = spent + response.usage
                if response.stop == "length":
                    raise StopReasonError(
                        f"the model's reply was cut off at max_tokens twice (last room {room} tokens)",
                        kind="max_tokens",
                        usage=spent,
                        text=response.text,
                    )
                continue
            case "paused" if pauses < MAX_PAUSE_CONTINUATIONS:
                pauses += 1
                partial: list[TextBlock | ToolUseBlock] = [TextBlock(text=response.text)] if response.text else []
                partial += response.tool_calls
                if partial:
                    request = request.model_copy(
                        update={"messages": [*request.messages, ChatMessage(role="assistant", content=partial)]}
                    )
                previous = response
                response = await call_with_retry(provider, request, policy, tracer, metrics, gate)
                spent = spent + response.usage
                response = response.model_copy(
                    update={
                        "text": previous.text + response.text,
                        "tool_calls": [*previous.tool_calls, *response.tool_calls],
                    }
                )
                continue
            case "refusal":
                raise StopReasonError(
                    f"the model refused to continue this task (stop_reason {raw})",
                    kind="refusal",
                    usage=spent,
                    text=response.text,
                )
            case "context_full":
                raise StopReasonError(
                    f"the prompt filled the model's context window (stop_reason {raw})",
                    kind="context_window_exceeded",
                    usage=spent,
                    text=response.text,
                )
            case "paused" | "unknown":
                raise StopReasonError(
                    f"the model stopped for a reason loopwarden does not handle: {raw!r}",
                    kind="unknown_stop_reason",
                    usage=spent,
                    text=response.text,
                )
            case _:
                assert_never(stop)


async def call_with_retry(
    provider: ModelProvider,
    request: ModelRequest,
    policy: BackoffPolicy,
    tracer: Tracer,
    metrics: T.GenAiMetrics | None = None,
    gate: CallGate | None = None,
) -> ModelResponse:
    """Call the model, retrying transient provider errors with full-jitter backoff.

    This is the only retry layer for model calls: the SDK's own retries are switched off.
    Each attempt is one GenAI client span carrying model, token usage (with the prompt
    cache's reads and writes), cost and the response id, and one point of the
    ``gen_ai.client.operation.duration`` / ``gen_ai.client.token.usage`` histograms when
    ``metrics`` is given.

    With a ``gate`` each attempt first waits for the provider key's rate limit (outside the span and
    the backoff's time budget), and a 429 pauses the key for every replica and is sent again through
    the gate rather than retried here (its wait is bounded by the gate).
    """
    started = time.monotonic()
    attempt = 0
    tries = 0
    while True:
        ticket = await gate.before(request) if gate is not None else None
        attempt += 1
        tries += 1
        with tracer.start_as_current_span(
            f"{'chat' if request.purpose != 'judge' else 'chat judge'} {request.model}",
            kind=SpanKind.CLIENT,
            attributes={
                T.GEN_AI_OPERATION_NAME: "chat",
                T.GEN_AI_PROVIDER_NAME: provider.name,
                T.GEN_AI_REQUEST_MODEL: request.model,
                T.GEN_AI_REQUEST_MAX_TOKENS: request.max_tokens,
                T.GEN_AI_CONVERSATION_ID: request.run_id,
                T.LW_RUN_ID: request.run_id,
                "loopwarden.model.purpose": request.purpose,
                "loopwarden.model.attempt": tries,
            },
        ) as span:
            if gate is not None:
                span.set_attribute(T.LW_RATELIMIT_WAIT_S, gate.waited_s)
            began = time.monotonic()
            try:
                response = await provider.complete(request)
            except ProviderError as err:
                if metrics is not None:
                    metrics.record(
                        provider=provider.name,
                        request_model=request.model,
                        duration_s=time.monotonic() - began,
                        error_type=err.kind,
                    )
                span.set_attribute(T.ERROR_TYPE, err.kind)
                span.set_status(Status(StatusCode.ERROR, str(err)))
                if gate is not None and await gate.after(ticket, error=err):
                    attempt -= 1  # a 429 the key is paused for: sent again once the gate lets it
                    continue
                if not err.transient:
                    raise
                elapsed = time.monotonic() - started - (gate.waited_s if gate is not None else 0.0)
                delay = next_delay(policy, attempt, elapsed, err.retry_after_s)
                if delay is None:
                    raise
                span.set_attribute(T.LW_BACKOFF_S, delay)
            else:
                u = response.usage
                span.set_attribute(T.GEN_AI_RESPONSE_MODEL, response.model)
                span.set_attribute(T.GEN_AI_USAGE_INPUT_TOKENS, u.input_tokens)
                span.set_attribute(T.GEN_AI_USAGE_OUTPUT_TOKENS, u.output_tokens)
                span.set_attribute(T.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS, u.cache_read_input_tokens)
                span.set_attribute(T.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS, u.cache_creation_input_tokens)
                span.set_attribute(T.LW_COST_USD, u.cost_usd)
                span.set_attribute(T.GEN_AI_RESPONSE_FINISH_REASONS, [response.stop_reason or response.stop])
                if response.id:
                    span.set_attribute(T.GEN_AI_RESPONSE_ID, response.id)
                if gate is not None:
                    await gate.after(ticket, response=response)
                if metrics is not None:
                    metrics.record(
                        provider=provider.name,
                        request_model=request.model,
                        response_model=response.model,
                        duration_s=time.monotonic() - began,
                        input_tokens=u.input_tokens,
                        output_tokens=u.output_tokens,
                    )
                return response
        await asyncio.sleep(delay)
