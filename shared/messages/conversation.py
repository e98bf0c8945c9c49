"""A run's conversation: the blocks of a chat message, and what a model call used."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from shared.messages.wire import Wire


class TextBlock(Wire):
    type: Literal["text"] = "text"
    text: str


class ToolUseBlock(Wire):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(Wire):
    type: Literal["tool_result"] = "tool_result"
    tool_use_id: str
    content: str
    is_error: bool = False


Block = Annotated[TextBlock | ToolUseBlock | ToolResultBlock, Field(discriminator="type")]


class ChatMessage(Wire):
    role: Literal["user", "assistant"]
    content: list[Block]

    @classmethod
    def user(cls, text: str) -> ChatMessage:
        return cls(role="user", content=[TextBlock(text=text)])

    def text(self) -> str:
        return "".join(b.text for b in self.content if isinstance(b, TextBlock))


class Usage(Wire):
    input_tokens: int = Field(0, description="every prompt token, cached or not (the cache fields are parts of it)")
    output_tokens: int = 0
    cost_usd: float = 0.0
    cache_read_input_tokens: int = Field(0, description="prompt tokens read from the prompt cache (billed at 0.1x)")
    cache_creation_input_tokens: int = Field(0, description="prompt tokens written to the prompt cache (1.25x)")

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cost_usd=round(self.cost_usd + other.cost_usd, 8),
            cache_read_input_tokens=self.cache_read_input_tokens + other.cache_read_input_tokens,
            cache_creation_input_tokens=self.cache_creation_input_tokens + other.cache_creation_input_tokens,
        )
