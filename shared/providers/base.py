"""The model interface the planner and the judge call, and the one retry loop around it."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal, Protocol

from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer
from pydantic import BaseModel, Field

from shared import telemetry as T
from shared.backoff import BackoffPolicy, next_delay
from shared.messages import ChatMessage, ToolUseBlock, Usage


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
    script_index: int = Field(0, description="which scripted reply this call replays")


class ModelResponse(BaseModel):
    text: str = ""
    tool_calls: list[ToolUseBlock] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    model: str = ""
    stop_reason: str = ""
    id: str = Field("", description="the provider's id for this response (gen_ai.response.id)")


class ProviderError(Exception):
    """A model call failed. ``transient`` errors (rate limit, overload, 5xx, timeouts) are
    retried by ``complete_with_retry``; the rest fail the call at once."""

    def __init__(
        self, message: str, *, transient: bool, retry_after_s: float | None = None, kind: str = "error"
    ) -> None:
        super().__init__(message)
        self.transient = transient
        self.retry_after_s = retry_after_s
        self.kind = kind


class ScriptExhausted(ProviderError):
    def __init__(self, message: str) -> None:
        super().__init__(message, transient=False, kind="script_exhausted")


class ModelProvider(Protocol):
    name: str

    async def complete(self, request: ModelRequest) -> ModelResponse: ...


async def complete_with_retry(
    provider: ModelProvider,
    request: ModelRequest,
    policy: BackoffPolicy,
    tracer: Tracer,
    metrics: T.GenAiMetrics | None = None,
) -> ModelResponse:
    """Call the model, retrying transient provider errors with full-jitter backoff.

    This is the only retry layer for model calls: the SDK's own retries are switched off.
    Each attempt is one GenAI client span carrying model, token usage and the response id, and
    one point of the ``gen_ai.client.operation.duration`` / ``gen_ai.client.token.usage``
    histograms when ``metrics`` is given.
    """
    started = time.monotonic()
    attempt = 0
    while True:
        attempt += 1
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
                "loopwarden.model.attempt": attempt,
            },
        ) as span:
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
                if not err.transient:
                    raise
                delay = next_delay(policy, attempt, time.monotonic() - started, err.retry_after_s)
                if delay is None:
                    raise
                span.set_attribute(T.LW_BACKOFF_S, delay)
            else:
                span.set_attribute(T.GEN_AI_RESPONSE_MODEL, response.model)
                span.set_attribute(T.GEN_AI_USAGE_INPUT_TOKENS, response.usage.input_tokens)
                span.set_attribute(T.GEN_AI_USAGE_OUTPUT_TOKENS, response.usage.output_tokens)
                span.set_attribute(T.GEN_AI_RESPONSE_FINISH_REASONS, [response.stop_reason or "end_turn"])
                if response.id:
                    span.set_attribute(T.GEN_AI_RESPONSE_ID, response.id)
                if metrics is not None:
                    metrics.record(
                        provider=provider.name,
                        request_model=request.model,
                        response_model=response.model,
                        duration_s=time.monotonic() - began,
                        input_tokens=response.usage.input_tokens,
                        output_tokens=response.usage.output_tokens,
                    )
                return response
        await asyncio.sleep(delay)
