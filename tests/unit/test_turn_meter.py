"""The scripted provider measures a run's plan turn incrementally (issue 8): it counts, renders and
hashes only the messages a turn added, and gets the same input tokens and prompt-cache answer as
measuring the whole request (``request_tokens``, ``PromptCache.answer(request_blocks(...))``)."""

from __future__ import annotations

from shared.messages import ChatMessage, TextBlock, ToolResultBlock, ToolUseBlock
from shared.providers.base import ModelRequest, ToolSpec
from shared.providers.prompt_cache import PromptCache, request_blocks
from shared.providers.scripted import TurnMeter, request_tokens

TOOLS = [
    ToolSpec(name="calculator", description="Adds. " * 200, input_schema={"type": "object", "properties": {}}),
    ToolSpec(name="search", description="Finds.", input_schema={"type": "object"}),
]


def request(run_id: str, messages: list[ChatMessage], tools: list[ToolSpec] = TOOLS, model: str = "m") -> ModelRequest:
    return ModelRequest(
        purpose="plan",
        model=f"claude-sonnet-4-5{model}",
        system="Be brief. " * 150,
        messages=messages,
        tools=tools,
        cache=True,
        run_id=run_id,
    )


def turn(k: int) -> list[ChatMessage]:
    return [
        ChatMessage(
            role="assistant",
            content=[TextBlock(text=f"step {k} " * 30), ToolUseBlock(id=f"t{k}", name="calculator", input={"e": k})],
        ),
        ChatMessage(role="user", content=[ToolResultBlock(tool_use_id=f"t{k}", content=str(k + 1) * 40)]),
    ]


class Twin:
    """The meter and the whole-request measure, each with its own prompt cache, asked the same turns."""

    def __init__(self) -> None:
        self.meter, self.mine, self.whole = TurnMeter(), PromptCache(), PromptCache()

    def agree(self, req: ModelRequest) -> None:
        tokens, kept = self.meter.input_tokens(req)
        assert tokens == request_tokens(req)
        assert kept is not None
        assert self.meter.answer(req, kept, self.mine) == self.whole.answer(req.model, request_blocks(req))


def test_a_growing_run_is_measured_the_same_as_the_whole_request_turn_after_turn() -> None:
    twin = Twin()
    history = [ChatMessage.user("Add the numbers. " * 300)]
    for k in range(12):  # the planner keeps the same message objects and appends to them
        twin.agree(request("run-a", [*history, ChatMessage.user("Continue.")] if k % 4 == 3 else list(history)))
        history += turn(k)
    assert twin.meter.seen(request("run-a", list(history))).length == len(history) - 1  # only the last is per turn


def test_a_compaction_a_reload_a_wrap_up_and_a_model_switch_are_measured_afresh_and_agree() -> None:
    twin = Twin()
    history = [ChatMessage.user("Add the numbers. " * 300)]
    for k in range(6):
        history += turn(k)
        twin.agree(request("run-b", list(history)))
    compacted = [ChatMessage(role="user", content=[*history[0].content, TextBlock(text="summary")]), *history[-4:]]
    twin.agree(request("run-b", compacted))  # a new first message
    reloaded = [m.model_copy(deep=True) for m in compacted]  # read back from KV: equal, not the same objects
    twin.agree(request("run-b", reloaded))
    twin.agree(request("run-b", [*reloaded, ChatMessage.user("Stop now.")], tools=[]))  # the wrap-up turn
    twin.agree(request("run-b", [*reloaded, *turn(9)], model="-fallback"))  # the budget switched the model
    relisted = [t.model_copy(deep=True) for t in TOOLS]  # the catalogue listed again: equal, new objects
    grown = [*reloaded, *turn(10)]
    twin.agree(request("run-b", grown, tools=relisted, model="-fallback"))
    kept = twin.meter.seen(request("run-b", grown, tools=relisted, model="-fallback"))
    assert kept.tools[0] is relisted[0] and kept.length == len(grown) - 1


def test_runs_are_measured_apart() -> None:
    twin = Twin()
    a = [ChatMessage.user("First task. " * 200)]
    b = [ChatMessage.user("Second task. " * 250)]
    for k in range(5):
        a += turn(k)
        twin.agree(request("run-c", list(a)))
        b += turn(k + 100)
        twin.agree(request("run-d", list(b)))
