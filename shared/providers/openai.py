"""An OpenAI-compatible provider: the official ``openai`` SDK, Chat Completions with tools.

It speaks to OpenAI itself and to the servers that copy its API (vLLM, Ollama, LiteLLM,
llama.cpp's server): base URL, key and model are set per role (planner, judge).

As for the anthropic provider, the SDK's own retries are off (``max_retries=0``): 429, 5xx,
408/409, timeouts and dropped connections become ``ProviderError(transient=True)`` carrying
Retry-After, and ``complete_with_retry`` is the one layer that retries them.

``finish_reason`` is mapped to our stop vocabulary (``STOP_MAP``): ``length`` gets one call with
more room, then a typed failure, and the cut-off reply (perhaps a tool call whose arguments
end mid-JSON) is never executed; ``content_filter`` is a refusal.

Usage: ``prompt_tokens`` is the whole prompt; ``prompt_tokens_details.cached_tokens`` is the part
read from the provider's automatic prompt cache, billed at the model's cached-input rate.
OpenAI bills no cache writes.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from shared.messages import ChatMessage, TextBlock, ToolResultBlock, ToolUseBlock
from shared.pricing import usage_for
from shared.providers.base import ModelRequest, ModelResponse, ProviderError, StopReason, map_stop
from shared.ratelimit.bucket import account_of
from shared.ratelimit.headers import kept, retry_after

if TYPE_CHECKING:  # the SDK is imported when a provider is built (it takes a second or more to import)
    import openai

TRANSIENT_STATUS = {408: "request_timeout", 409: "conflict"}
# Every finish_reason Chat Completions documents, in our words (anything else maps to "unknown").
STOP_MAP: dict[str, StopReason] = {
    "stop": "answer",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",  # the deprecated single-function form
    "length": "length",
    "content_filter": "refusal",
}
# OpenAI-compatible servers without a key still need the SDK to send one.
NO_KEY = "no-key"
DEFAULT_BASE_URL = "https://api.openai.com/v1"


def _retry_after(err: openai.APIStatusError) -> float | None:
    """The answer's ``retry-after`` (or ``retry-after-ms``) in seconds: a number or an HTTP date."""
    return retry_after(_headers(err), time.time())


def _headers(err: openai.APIStatusError) -> dict[str, str]:
    """The rate-limit headers of an error's answer (a 429 says how long the key is paused)."""
    return kept(err.response.headers) if err.response is not None else {}


def to_api_messages(system: str, messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Our conversation as Chat Completions ``messages``: tool results become ``tool`` messages
    (right after the assistant turn that called them), tool calls the assistant's ``tool_calls``."""
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for message in messages:
        texts = [b.text for b in message.content if isinstance(b, TextBlock) and b.text.strip()]
        if message.role == "assistant":
            calls = [
                {
                    "id": b.id,
                    "type": "function",
                    "function": {"name": b.name, "arguments": json.dumps(b.input, ensure_ascii=False)},
                }
                for b in message.content
                if isinstance(b, ToolUseBlock)
            ]
            if texts or calls:
                turn: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) or None}
                if calls:
                    turn["tool_calls"] = calls
                out.append(turn)
            continue
        for b in message.content:
            if isinstance(b, ToolResultBlock):
                content = f"[error] {b.content}" if b.is_error else b.content
                out.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": content})
        if texts:
            out.append({"role": "user", "content": "\n".join(texts)})
    return out


def api_body(request: ModelRequest) -> dict[str, Any]:
    """The Chat Completions request body for ``request``."""
    body: dict[str, Any] = {
        "model": request.model,
        "max_completion_tokens": request.max_tokens,
        "messages": to_api_messages(request.system, request.messages),
    }
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description, "parameters": t.input_schema},
            }
            for t in request.tools
        ]
        body["parallel_tool_calls"] = True
    return body


class OpenAIProvider:
    name = "openai"

    def __init__(self, api_key: str | None, base_url: str | None = None, timeout_s: float = 120.0) -> None:
        import openai

        self._client = openai.AsyncOpenAI(
            api_key=api_key or NO_KEY, base_url=base_url, max_retries=0, timeout=timeout_s
        )
        self.account = account_of(base_url or DEFAULT_BASE_URL, api_key)  # the fleet's name for this key

    async def complete(self, request: ModelRequest) -> ModelResponse:
        import openai  # loaded by __init__: a lookup

        try:
            # the raw answer: its rate-limit headers teach the fleet the key's limits (docs/rate-limits.md)
            raw = await self._client.chat.completions.with_raw_response.create(**api_body(request))
            completion = raw.parse()
        except openai.RateLimitError as err:
            raise ProviderError(
                f"rate limited by the model provider (HTTP 429): {err.message}",
                transient=True,
                retry_after_s=_retry_after(err),
                kind="rate_limit",
                headers=_headers(err),
            ) from err
        except openai.InternalServerError as err:  # 500, 502, 503, ...
            raise ProviderError(
                f"model provider unavailable (HTTP {err.status_code}): {err.message}",
                transient=True,
                retry_after_s=_retry_after(err),
                kind="server_error",
                headers=_headers(err),
            ) from err
        except openai.APITimeoutError as err:
            raise ProviderError("model call timed out", transient=True, kind="timeout") from err
        except openai.APIConnectionError as err:
            raise ProviderError(f"cannot reach the model provider: {err}", transient=True, kind="connection") from err
        except openai.APIStatusError as err:
            if err.status_code in TRANSIENT_STATUS:
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
        if not completion.choices:
            raise ProviderError("the model provider answered with no choice", transient=True, kind="empty_reply")
        choice = completion.choices[0]
        stop = map_stop(STOP_MAP, choice.finish_reason)
        calls: list[ToolUseBlock] = []
        for call in choice.message.tool_calls or []:
            if call.type != "function":
                continue
            try:
                args = json.loads(call.function.arguments or "{}")
            except json.JSONDecodeError:
                args = None
            if not isinstance(args, dict):
                if stop == "length":
                    break  # cut off mid-arguments: the turn is asked again with more room, never executed
                raise ProviderError(
                    f"the model sent tool call '{call.function.name}' with arguments that are not a JSON object",
                    transient=True,  # a fresh sample usually is well-formed: retried by complete_with_retry
                    kind="malformed_tool_call",
                )
            calls.append(ToolUseBlock(id=call.id, name=call.function.name, input=args))
        if calls and stop == "answer":
            stop = "tool_calls"  # some compatible servers say "stop" after tool calls
        u = completion.usage
        prompt, output, cached = 0, 0, 0
        if u is not None:
            prompt, output = u.prompt_tokens or 0, u.completion_tokens or 0
            details = u.prompt_tokens_details
            cached = (details.cached_tokens or 0) if details is not None else 0
        return ModelResponse(
            text=choice.message.content or "",
            tool_calls=calls,
            usage=usage_for(completion.model, prompt, output, cache_read=cached),
            model=completion.model,
            stop=stop,
            stop_reason=choice.finish_reason or "",
            id=completion.id or "",
            headers=kept(raw.headers),
        )
