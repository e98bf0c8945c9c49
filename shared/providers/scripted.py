"""The scripted provider: replays a scenario's turns deterministically, offline.

It is an honest implementation of the provider interface — it consumes the request the
planner built, counts its tokens with the real tokenizer and reports usage — so the
whole loop runs the same code paths as with a real model. Running out of turns is a clear
error, never a silent empty reply.
"""

from __future__ import annotations

import asyncio
import json

from shared import tokens
from shared.messages import ToolUseBlock, Usage
from shared.pricing import usage_for
from shared.providers.base import ModelRequest, ModelResponse, ProviderError, ScriptExhausted
from shared.providers.prompt_cache import PromptCache, request_blocks
from shared.scenario import Scenario


def request_tokens(request: ModelRequest) -> int:
    """Input tokens of a request, counted with the real tokenizer."""
    total = tokens.count(request.system)
    for message in request.messages:
        total += 4 + tokens.count_content(message.content)
    for tool in request.tools:
        total += tokens.count_model(tool)
    return total


# One cache per process, like the API's per organisation: a run's turns read what its earlier turns wrote.
PROMPT_CACHE = PromptCache()


def cached_usage(request: ModelRequest, input_tokens: int, output_tokens: int, caching: bool) -> Usage:
    """Usage of a call billed as the API would with prompt caching: the request is rendered as the
    anthropic provider sends it (breakpoints included) and answered by the prompt cache."""
    if not (caching and request.cache):
        return usage_for(request.model, input_tokens, output_tokens)
    answer = PROMPT_CACHE.answer(request.model, request_blocks(request))
    read = min(answer.read, input_tokens)
    written = min(answer.written, input_tokens - read)
    return usage_for(request.model, input_tokens, output_tokens, cache_read=read, cache_write=written)


class ScriptedProvider:
    name = "scripted"

    def __init__(self, scenario: Scenario, prompt_caching: bool = True) -> None:
        self.scenario = scenario
        self.prompt_caching = prompt_caching

    async def complete(self, request: ModelRequest) -> ModelResponse:
        response = await self._complete(request)
        # a stable id per replayed reply, as a real provider's message id (gen_ai.response.id)
        return response.model_copy(update={"id": f"scripted_{request.purpose}_{request.run_id or '_'}_{request.seq}"})

    async def _complete(self, request: ModelRequest) -> ModelResponse:
        if request.purpose == "plan":
            turns = self.scenario.planner
            if request.seq < len(turns) and turns[request.seq].latency_s:
                await asyncio.sleep(turns[request.seq].latency_s)
            return self._plan(request)
        if request.purpose == "summarize":
            return self._summary(request)
        judged = self.scenario.judge
        if request.seq < len(judged) and judged[request.seq].latency_s:
            await asyncio.sleep(judged[request.seq].latency_s)
        return self._judge(request)

    def _plan(self, request: ModelRequest) -> ModelResponse:
        turns = self.scenario.planner
        i = request.seq
        if i >= len(turns):
            raise ScriptExhausted(
                f"scenario '{self.scenario.name}' has {len(turns)} planner turn(s); model call #{i + 1} has no "
                "scripted reply"
            )
        turn = turns[i]
        if turn.error is not None:
            transient = turn.error.type != "fatal"
            raise ProviderError(
                turn.error.message, transient=transient, retry_after_s=turn.error.retry_after_s, kind=turn.error.type
            )
        calls = [
            ToolUseBlock(id=c.id or f"toolu_{i + 1:03d}_{j + 1:02d}", name=c.name, input=c.input)
            for j, c in enumerate(turn.tool_calls)
        ]
        text = turn.text or ""
        if turn.usage is not None:  # scripted usage is billed as written (no cache)
            usage = usage_for(request.model, turn.usage.input_tokens, turn.usage.output_tokens)
        else:
            inp = request_tokens(request)
            out = tokens.count(text) + sum(tokens.count_json(c.model_dump()) for c in calls)
            usage = cached_usage(request, inp, out, self.prompt_caching)
        return ModelResponse(
            text=text,
            tool_calls=calls,
            usage=usage,
            model=request.model,
            stop_reason="tool_use" if calls else "end_turn",
        )

    def _judge(self, request: ModelRequest) -> ModelResponse:
        turns = self.scenario.judge
        i = request.seq
        if i >= len(turns):
            raise ScriptExhausted(
                f"scenario '{self.scenario.name}' has {len(turns)} judge repl(ies); judge call #{i + 1} has none"
            )
        turn = turns[i]
        if turn.error is not None:
            raise ProviderError(turn.error, transient=False, kind="judge_error")
        if turn.raw is not None:
            text = turn.raw
        else:
            text = json.dumps({"scores": turn.scores, "reasons": turn.reasons}, ensure_ascii=False)
        inp, out = request_tokens(request), tokens.count(text)
        return ModelResponse(
            text=text, usage=usage_for(request.model, inp, out), model=request.model, stop_reason="end_turn"
        )

    def _summary(self, request: ModelRequest) -> ModelResponse:
        summaries = self.scenario.summaries
        i = request.seq
        if i < len(summaries):
            text = summaries[i]
        else:
            # No scripted summary: an extractive digest (first line of each older turn), labelled
            # as such, so compaction still runs offline.
            lines = []
            for message in request.messages:
                first = message.text().strip().splitlines()[:1]
                if first:
                    lines.append(f"- {message.role}: {first[0][:160]}")
            text = "Extractive summary of earlier turns:\n" + "\n".join(lines)
        inp, out = request_tokens(request), tokens.count(text)
        return ModelResponse(
            text=text, usage=usage_for(request.model, inp, out), model=request.model, stop_reason="end_turn"
        )
