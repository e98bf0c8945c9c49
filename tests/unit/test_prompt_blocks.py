"""The scripted provider's prompt, block by block, rendered once per block object (issue 8): the same
blocks, keys, token counts and breakpoints as rendering the whole request body every turn."""

from __future__ import annotations

from shared.messages import ChatMessage, TextBlock, ToolResultBlock, ToolUseBlock
from shared.providers.anthropic import api_body
from shared.providers.base import ModelRequest, ToolSpec
from shared.providers.prompt_cache import PromptCache, blocks_of, request_blocks

TOOLS = [ToolSpec(name="calculator", description="Adds.", input_schema={"type": "object", "properties": {}})]


def request(messages: list[ChatMessage], system: str = "Be brief.", tools: list[ToolSpec] = TOOLS) -> ModelRequest:
    return ModelRequest(
        purpose="plan", model="claude-sonnet-4-5", system=system, messages=messages, tools=tools, cache=True
    )


def turn(k: int) -> list[ChatMessage]:
    return [
        ChatMessage(
            role="assistant",
            content=[TextBlock(text=f"step {k}"), ToolUseBlock(id=f"t{k}", name="calculator", input={"e": f"{k}+1"})],
        ),
        ChatMessage(
            role="user", content=[ToolResultBlock(tool_use_id=f"t{k}", content=str(k + 1), is_error=k % 3 == 0)]
        ),
    ]


def test_request_blocks_agree_with_rendering_the_whole_body_turn_after_turn() -> None:
    history = [ChatMessage.user("Add the numbers."), ChatMessage(role="assistant", content=[TextBlock(text="  ")])]
    for k in range(12):  # the same message objects grow turn by turn, as the planner keeps them
        history += turn(k)
        req = request(list(history))
        assert request_blocks(req) == blocks_of(api_body(req, caching=True))
    # a role the memo has not seen for that object, no system, no tools, no messages
    assert request_blocks(request([], system="", tools=[])) == blocks_of(api_body(request([], system="", tools=[])))
    moved = request([ChatMessage(role="user", content=history[2].content)])
    assert request_blocks(moved) == blocks_of(api_body(moved, caching=True))
    last_empty = request([*history, ChatMessage(role="assistant", content=[TextBlock(text="")])])
    assert request_blocks(last_empty) == blocks_of(api_body(last_empty, caching=True))


def test_the_cache_answers_the_same_either_way() -> None:
    history = [ChatMessage.user("Add the numbers. " * 400)]
    a, b = PromptCache(), PromptCache()
    for k in range(5):
        history += turn(k)
        req = request(list(history))
        assert a.answer(req.model, request_blocks(req)) == b.answer(req.model, blocks_of(api_body(req, caching=True)))


def test_tool_specs_are_the_same_objects_per_contract_and_count_as_their_dump() -> None:
    from services.planner import context as C
    from shared import tokens
    from shared.messages import ToolContract
    from tests.support.transitions import state_of

    schema = {"type": "object", "properties": {"e": {"type": "string", "description": "expression " * 30}}}
    contracts = {
        n: ToolContract(name=n, description=f"{n}. Does it well.", inputSchema=schema, outputSchema=schema)
        for n in ("a", "b", "submit_result")
    }
    s = state_of(4)
    first, again = C.tool_specs(s, contracts), C.tool_specs(s, contracts)
    assert all(x is y for x, y in zip(first, again, strict=True))
    assert C.tools_tokens(again) == sum(tokens.count_json(t.model_dump()) for t in again)
    short = C.tool_specs(s, contracts, progressive_above=1)  # not called yet: one line each, terminal whole
    assert [isinstance(t, C.ToolSummary) for t in short] == [True, True, False]
    assert C.tools_tokens(short) == sum(tokens.count_json(t.model_dump()) for t in short) < C.tools_tokens(first)
    renewed = {n: c.model_copy(update={"description": "other"}) for n, c in contracts.items()}  # new objects
    assert [t.description for t in C.tool_specs(s, renewed)] == ["other"] * 3
