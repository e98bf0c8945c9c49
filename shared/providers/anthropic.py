"""The production provider: the official Anthropic SDK, Messages API with tools.

The SDK's own retries are off (``max_retries=0``): transient errors (429 rate limit, 529
overloaded, 5xx, timeouts, dropped connections) become ``ProviderError(transient=True)``
carrying Retry-After, and ``complete_with_retry`` is the one layer that retries them.
The SDK's own spans are off too; ``complete_with_retry`` emits one GenAI span per attempt.
"""

from __future__ import annotations

from typing import Any

import anthropic

from shared.messages import ChatMessage, TextBlock, ToolResultBlock, ToolUseBlock
from shared.pricing import usage_for
from shared.providers.base import ModelRequest, ModelResponse, ProviderError


def _retry_after(err: anthropic.APIStatusError) -> float | None:
    value = err.response.headers.get("retry-after") if err.response is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


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


class AnthropicProvider:
    name = "anthropic"

    def __init__(self, api_key: str, base_url: str | None = None, timeout_s: float = 120.0) -> None:
        self._client = anthropic.AsyncAnthropic(
            api_key=api_key, base_url=base_url, max_retries=0, timeout=timeout_s, open_telemetry=False
        )

    async def complete(self, request: ModelRequest) -> ModelResponse:
        kwargs: dict[str, Any] = {
            "model": request.model,
            "max_tokens": request.max_tokens,
            "system": request.system,
            "messages": to_api_messages(request.messages),
        }
        if request.tools:
            kwargs["tools"] = [t.model_dump() for t in request.tools]
        try:
            message = await self._client.messages.create(**kwargs)
        except anthropic.RateLimitError as err:
            raise ProviderError(
                f"rate limited by the model provider (HTTP 429): {err.message}",
                transient=True,
                retry_after_s=_retry_after(err),
                kind="rate_limit",
            ) from err
        except anthropic.InternalServerError as err:  # 500, 503, 529 overloaded
            kind = "overloaded" if err.status_code == 529 else "server_error"
            raise ProviderError(
                f"model provider unavailable (HTTP {err.status_code}): {err.message}",
                transient=True,
                retry_after_s=_retry_after(err),
                kind=kind,
            ) from err
        except anthropic.APITimeoutError as err:
            raise ProviderError("model call timed out", transient=True, kind="timeout") from err
        except anthropic.APIConnectionError as err:
            raise ProviderError(f"cannot reach the model provider: {err}", transient=True, kind="connection") from err
        except anthropic.APIStatusError as err:
            raise ProviderError(
                f"model provider refused the request (HTTP {err.status_code}): {err.message}",
                transient=False,
                kind=f"http_{err.status_code}",
            ) from err
        text_parts: list[str] = []
        calls: list[ToolUseBlock] = []
        for block in message.content:
            if block.type == "text":
                text_parts.append(block.text)
            elif block.type == "tool_use":
                calls.append(ToolUseBlock(id=block.id, name=block.name, input=dict(block.input or {})))
        usage = usage_for(message.model, message.usage.input_tokens, message.usage.output_tokens)
        return ModelResponse(
            text="".join(text_parts),
            tool_calls=calls,
            usage=usage,
            model=message.model,
            stop_reason=message.stop_reason or "",
            id=message.id or "",
        )
