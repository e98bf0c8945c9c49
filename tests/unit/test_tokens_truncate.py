"""``tokens.truncate`` skips the tokenizer for a text too short to exceed the limit (a token is at
least one byte), and otherwise cuts as before: the same text and dropped count either way. The tokenizer's table
is loaded as a service that counts starts, not in its first run's first turn."""

from __future__ import annotations

from shared import tokens


def by_tokenizer(text: str, max_tokens: int) -> tuple[str, int]:
    ids = tokens.encoding().encode(text, disallowed_special=())
    if len(ids) <= max_tokens:
        return text, 0
    return tokens.encoding().decode(ids[:max_tokens]), len(ids) - max_tokens


def test_truncate_agrees_with_the_tokenizer_at_and_around_the_limit() -> None:
    texts = ["", "42", "x" * 50, "héllo wörld " * 20, "数字" * 40, "🙂" * 30, '{"a": [1, 2, 3]}' * 10]
    for text in texts:
        for limit in (0, 1, 5, 16, len(text) // 2, len(text), len(text.encode()), len(text.encode()) + 1):
            assert tokens.truncate(text, limit) == by_tokenizer(text, limit), (text[:20], limit)


def test_a_service_that_counts_tokens_loads_the_table_at_start_and_no_other_does() -> None:
    from shared.service import warm_up

    tokens.encoding.cache_clear()
    warm_up("validator")
    assert tokens.encoding.cache_info().currsize == 0
    warm_up("planner")
    assert tokens.encoding.cache_info().currsize == 1  # loaded before the first turn counts anything
