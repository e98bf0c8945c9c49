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
from shared.messages import ToolUseBlock
from shared.pricing import usage_for
from shared.providers.base import ModelRequest, ModelResponse, ProviderError, ScriptExhausted
from shared.scenario import Scenario


def request_tokens(request: ModelRequest) -> int:
    """Input tokens of a request, counted with the real tokenizer."""
    total = tokens.count(request.system)
    for message in request.messages:
        total += 4 + tokens.count_content(message.content)
    for tool in request.tools:
        total += tokens.count_json(tool.model_dump())
    return total


class ScriptedProvider:
    name = "scripted"

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario

    async def complete(self, request: ModelRequest) -> ModelResponse:
        response = await self._complete(request)
        # a stable id per replayed reply, as a real provider's message id (gen_ai.response.id)
        return response.model_copy(
            update={"id": f"scripted_{request.purpose}_{request.run_id or '_'}_{request.script_index}"}
        )

    async def _complete(self, request: ModelRequest) -> ModelResponse:
        if request.purpose == "plan":
            turns = self.scenario.planner
            if request.script_index < len(turns) and turns[request.script_index].latency_s:
                await asyncio.sleep(turns[request.script_index].latency_s)
            return self._plan(request)
        if request.purpose == "summarize":
            return self._summary(request)
        judged = self.scenario.judge
        if request.script_index < len(judged) and judged[request.script_index].latency_s:
            await asyncio.sleep(judged[request.script_index].latency_s)
        return self._judge(request)

    def _plan(self, request: ModelRequest) -> ModelResponse:
        turns = self.scenario.planner
        i = request.script_index
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
        if turn.usage is not None:
            inp, out = turn.usage.input_tokens, turn.usage.output_tokens
        else:
            inp = request_tokens(request)
            out = tokens.count(text) + sum(tokens.count_json(c.model_dump()) for c in calls)
        return ModelResponse(
            text=text,
            tool_calls=calls,
            usage=usage_for(request.model, inp, out),
            model=request.model,
            stop_reason="tool_use" if calls else "end_turn",
        )

    def _judge(self, request: ModelRequest) -> ModelResponse:
        turns = self.scenario.judge
        i = request.script_index
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
        i = request.script_index
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
