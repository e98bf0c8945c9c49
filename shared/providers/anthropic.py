"""The production provider: the official Anthropic SDK, Messages API with tools.

The SDK's own retries are off (``max_retries=0``): transient errors (429 rate limit, 529
overloaded, 5xx, timeouts, dropped connections) become ``ProviderError(transient=True)``
carrying Retry-After, and ``complete_with_retry`` is the one layer that retries them.
The SDK's own spans are off too; ``complete_with_retry`` emits one GenAI span per attempt.
408 (request timeout) and 409 (lock conflict) are transient too, as the SDK itself treats them.

Prompt caching: ``api_body`` puts a breakpoint on the system prompt (tools + system, the
stable prefix) and a rolling one on the conversation's last block (see ``prompt_cache``).
The API reports ``input_tokens`` *without* the cached parts; our ``Usage.input_tokens`` is
the whole prompt, with cache reads and writes as parts of it, each billed at its rate.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from shared.messages import ChatMessage, TextBlock, ToolResultBlock, ToolUseBlock
from shared.pricing import usage_for
from shared.providers.base import ModelRequest, ModelResponse, ProviderError, StopReason, map_stop
from shared.ratelimit.bucket import account_of
from shared.ratelimit.headers import kept, retry_after

if TYPE_CHECKING:  # the SDK is imported when a provider is built (it takes a second or more to import)
    import anthropic

EPHEMERAL = {"type": "ephemeral"}
DEFAULT_BASE_URL = "https://api.anthropic.com"
TRANSIENT_STATUS = {408: "request_timeout", 409: "conflict"}
# Every stop reason the Messages API documents, in our words (anything else maps to "unknown").
STOP_MAP: dict[str, StopReason] = {
    "end_turn": "answer",
    "stop_sequence": "answer",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "pause_turn": "paused",
    "refusal": "refusal",
    "model_context_window_exceeded": "context_full",
}


def _retry_after(err: anthropic.APIStatusError) -> float | None:
    """The answer's ``retry-after`` (or ``retry-after-ms``) in seconds: a number or an HTTP date."""
    return retry_after(_headers(err), time.time())


def _headers(err: anthropic.APIStatusError) -> dict[str, str]:
    """The rate-limit headers of an error's answer (a 429 says how long the key is paused)."""
    return kept(err.response.headers) if err.response is not None else {}


def to_api_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Our conversation as Messages API ``messages`` (empty text blocks dropped: the API refuses them)."""
    out: list[dict[str, Any]] = []
    for message in messages:
        blocks: list[dict[str, Any]] = []
        for block in message.content:
            if isinstance(block, TextBlock):
                if block.text.strip():
                    blocks.append({"type": "text", "text": block.text})
            elif isinstance(block, ToolUseBlock):
                blocks.append({"type": "tool_use", "id": block.id, "name": block.name, "input": block.input})
            elif isinstance(block, ToolResultBlock):
                blocks.append(
                    {
                        "type": "tool_result",
                        "tool_use_id": block.tool_use_id,
                        "content": block.content,
                        "is_error": block.is_error,
                    }
                )
        if blocks:
            out.append({"role": message.role, "content": blocks})
    return out


def api_body(request: ModelRequest, caching: bool = True) -> dict[str, Any]:
    """The Messages API request body for ``request``: with breakpoints when ``caching`` and the request allows it."""
    cache = caching and request.cache
    body: dict[str, Any] = {
        "model": request.model,
        "max_tokens": request.max_tokens,
        "messages": to_api_messages(request.messages),
    }
    if cache and request.system:
        body["system"] = [{"type": "text", "text": request.system, "cache_control": dict(EPHEMERAL)}]
    else:
        body["system"] = request.system
    if request.tools:
        body["tools"] = [t.model_dump() for t in request.tools]
    if cache and body["messages"]:
        last = body["messages"][-1]["content"][-1]
        last["cache_control"] = dict(EPHEMERAL)  # the rolling breakpoint
    return body


class AnthropicProvider:
    name = "anthropic"

    def __init__(
        self, api_key: str, base_url: str | None = None, timeout_s: float = 120.0, prompt_caching: bool = True
    ) -> None:
        import anthropic

        self._client = anthropic.AsyncAnthropic(
            api_key=api_key, base_url=base_url, max_retries=0, timeout=timeout_s, open_telemetry=False
        )
        self.prompt_caching = prompt_caching
        self.account = account_of(base_url or DEFAULT_BASE_URL, api_key)  # the fleet's name for this key

    async def complete(self, request: ModelRequest) -> ModelResponse:
        import anthropic  # loaded by __init__: a lookup

        kwargs = api_body(request, self.prompt_caching)
        try:
            # the raw answer: its rate-limit headers teach the fleet the key's limits (docs/rate-limits.md)
            raw = await self._client.messages.with_raw_response.create(**kwargs)
            message = await raw.parse()
        except anthropic.RateLimitError as err:
            raise ProviderError(
                f"rate limited by the model provider (HTTP 429): {err.message}",
                transient=True,
                retry_after_s=_retry_after(err),
                kind="rate_limit",
                headers=_headers(err),
            ) from err
        except anthropic.InternalServerError as err:  # 500, 503, 529 overloaded
            kind = "overloaded" if err.status_code == 529 else "server_error"
            raise ProviderError(
                f"model provider unavailable (HTTP {err.status_code}): {err.message}",
                transient=True,
                retry_after_s=_retry_after(err),
                kind=kind,
                headers=_headers(err),
            ) from err
        except anthropic.APITimeoutError as err:
            raise ProviderError("model call timed out", transient=True, kind="timeout") from err
        except anthropic.APIConnectionError as err:
            raise ProviderError(f"cannot reach the model provider: {err}", transient=True, kind="connection") from err
        except anthropic.APIStatusError as err:
            if err.status_code in TRANSIENT_STATUS:  # the SDK retries these itself: so do we
                raise ProviderError(
                    f"model provider asks to try again (HTTP {err.status_code}): {err.message}",
                    transient=True,
                    retry_after_s=_retry_after(err),
                    kind=TRANSIENT_STATUS[err.status_code],
                    headers=_headers(err),
                ) from err
            raise ProviderError(
                f"model provider refused the request (HTTP {err.status_code}): {err.message}",
                transient=False,
                kind=f"http_{err.status_code}",
                headers=_headers(err),
            ) from err
        text_parts: list[str] = []
        calls: list[ToolUseBlock] = []
        for block in message.content:
            if block.type == "text":
                text_parts.append(block.text)
            elif block.type == "tool_use":
                calls.append(ToolUseBlock(id=block.id, name=block.name, input=dict(block.input or {})))
        u = message.usage
        read, written = u.cache_read_input_tokens or 0, u.cache_creation_input_tokens or 0
        usage = usage_for(
            message.model, u.input_tokens + read + written, u.output_tokens, cache_read=read, cache_write=written
        )
        return ModelResponse(
            text="".join(text_parts),
            tool_calls=calls,
            usage=usage,
            model=message.model,
            stop=map_stop(STOP_MAP, message.stop_reason),
            stop_reason=message.stop_reason or "",
            id=message.id or "",
            headers=kept(raw.headers),
        )
