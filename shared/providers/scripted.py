"""The scripted provider: replays a scenario's turns deterministically, offline.

It is an honest implementation of the provider interface — it consumes the request the
planner built, counts its tokens with the real tokenizer and reports usage — so the
whole loop runs the same code paths as with a real model. Running out of turns is a clear
error, never a silent empty reply.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from collections import OrderedDict
from dataclasses import dataclass

from shared import tokens
from shared.messages import ChatMessage, ToolUseBlock, Usage
from shared.pricing import usage_for
from shared.providers.base import ModelRequest, ModelResponse, ProviderError, ScriptExhausted, ToolSpec
from shared.providers.prompt_cache import CacheAnswer, Chain, PromptCache, head_blocks, message_blocks, request_blocks
from shared.scenario import Scenario


def request_tokens(request: ModelRequest) -> int:
    """Input tokens of a request, counted with the real tokenizer."""
    total = tokens.count(request.system)
    for message in request.messages:
        total += tokens.count_message(message)
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
    return billed(request, PROMPT_CACHE.answer(request.model, request_blocks(request)), input_tokens, output_tokens)


def billed(request: ModelRequest, answer: CacheAnswer, input_tokens: int, output_tokens: int) -> Usage:
    """Usage of a call whose prompt the cache answered: reads and writes within the input tokens."""
    read = min(answer.read, input_tokens)
    written = min(answer.written, input_tokens - read)
    return usage_for(request.model, input_tokens, output_tokens, cache_read=read, cache_write=written)


@dataclass
class _Seen:
    """What a run's last turn request was measured as, up to (not including) its last message: the
    conversation's head is the same objects next turn (the planner keeps its state), so only what
    the turn added is counted, rendered and hashed again."""

    model: str
    system: str
    tools: list[ToolSpec]
    first: weakref.ref[ChatMessage] | None
    last: weakref.ref[ChatMessage] | None
    length: int
    head_tokens: int  # the system prompt and the tools
    message_tokens: int  # messages[:length]
    marks: list[int]  # breakpoints among the head blocks
    head: int  # how many head blocks
    chain: Chain  # head blocks + the blocks of messages[:length]

    def fits(self, request: ModelRequest) -> bool:
        msgs, n = request.messages, self.length
        return (
            self.model == request.model
            and self.system == request.system
            and len(self.tools) == len(request.tools)
            and all(a is b or a == b for a, b in zip(self.tools, request.tools, strict=True))
            and len(msgs) > n
            and (n == 0 or (self.first is not None and self.first() is msgs[0]))
            and (n == 0 or (self.last is not None and self.last() is msgs[n - 1]))
        )


class TurnMeter:
    """A plan turn's input tokens and prompt-cache answer, kept per run so a turn costs what it
    added, not the whole conversation (``request_tokens`` and ``cached_usage`` give the same figures)."""

    MAX_RUNS = 1024

    def __init__(self) -> None:
        self._runs: OrderedDict[str, _Seen] = OrderedDict()

    def seen(self, request: ModelRequest) -> _Seen:
        run_id = request.run_id or ""
        kept = self._runs.pop(run_id, None)
        if kept is not None and kept.fits(request):
            kept.tools = list(request.tools)  # equal tools, maybe new objects (the catalogue was listed again)
        else:
            head = head_blocks(request)
            chain = Chain(request.model)
            chain.extend(head)
            head_tokens = tokens.count(request.system) + sum(tokens.count_model(t) for t in request.tools)
            marks = [i for i, b in enumerate(head) if b.breakpoint]
            kept = _Seen(
                request.model,
                request.system,
                list(request.tools),
                None,
                None,
                0,
                head_tokens,
                0,
                marks,
                len(head),
                chain,
            )
        msgs = request.messages
        new = msgs[kept.length : len(msgs) - 1]  # the last message is measured per turn, never kept
        for message in new:
            kept.message_tokens += tokens.count_message(message)
            kept.chain.extend(message_blocks(message))
        if new:
            kept.length = len(msgs) - 1
            kept.first, kept.last = weakref.ref(msgs[0]), weakref.ref(msgs[kept.length - 1])
        self._runs[run_id] = kept
        while len(self._runs) > self.MAX_RUNS:
            self._runs.popitem(last=False)
        return kept

    def input_tokens(self, request: ModelRequest) -> tuple[int, _Seen | None]:
        """``request_tokens(request)``; for a plan turn of a run, counting only what is new."""
        if request.purpose != "plan" or not request.run_id or not request.messages:
            return request_tokens(request), None
        kept = self.seen(request)
        return kept.head_tokens + kept.message_tokens + tokens.count_message(request.messages[-1]), kept

    def answer(self, request: ModelRequest, kept: _Seen, cache: PromptCache) -> CacheAnswer:
        """``cache.answer(request.model, request_blocks(request))``, hashing only the blocks this turn added."""
        last = message_blocks(request.messages[-1])
        hashes, cumulative = kept.chain.peek(last)
        chain, n = kept.chain, len(kept.chain.hashes)
        marks = list(kept.marks)
        if last or n > kept.head:  # the rolling breakpoint: the conversation's last block
            marks.append(n + len(last) - 1)
        # the last message's blocks are added for the answer and taken off again (not a copy of the whole chain)
        chain.hashes += hashes
        chain.cumulative += cumulative
        try:
            return cache.answer_chain(request.model, chain.hashes, chain.cumulative, marks)
        finally:
            del chain.hashes[n:], chain.cumulative[n:]

    def usage(
        self, request: ModelRequest, kept: _Seen | None, input_tokens: int, output_tokens: int, caching: bool
    ) -> Usage:
        """``cached_usage``, hashing only the blocks this turn added."""
        if kept is None or not (caching and request.cache):
            return cached_usage(request, input_tokens, output_tokens, caching)
        return billed(request, self.answer(request, kept, PROMPT_CACHE), input_tokens, output_tokens)


TURNS = TurnMeter()


class ScriptedProvider:
    name = "scripted"

    def __init__(self, scenario: Scenario, prompt_caching: bool = True) -> None:
        self.scenario = scenario
        self.prompt_caching = prompt_caching

    async def complete(self, request: ModelRequest) -> ModelResponse:
        response = await self._complete(request)  # a new object each call: given its id in place, not copied
        # a stable id per replayed reply, as a real provider's message id (gen_ai.response.id)
        response.id = f"scripted_{request.purpose}_{request.run_id or '_'}_{request.seq}"
        return response

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
            inp, kept = TURNS.input_tokens(request)
            out = tokens.count(text) + sum(tokens.count_json(c.model_dump()) for c in calls)
            usage = TURNS.usage(request, kept, inp, out, self.prompt_caching)
        return ModelResponse(
            text=text,
            tool_calls=calls,
            usage=usage,
            model=request.model,
            stop="tool_calls" if calls else "answer",
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
