"""Bounded forms of values that must stay small whatever a tool returned (pure).

The planner keeps at most ``LW_RUN_STATE_RESULT_MAX_BYTES`` of one tool result in its run state
(:func:`bounded_outcome`, which marks the cut with a note); whoever cuts that text again reads the note
with :func:`split_bounded`, so what the model is told counts the whole cut."""

from __future__ import annotations

import json
import re
from typing import Any

from shared.messages import ToolOutcome


def bounded(value: Any, max_bytes: int) -> tuple[Any, int | None]:
    """``value`` if its JSON fits in ``max_bytes``; else its JSON cut to that size as text, with a note,
    and the full size. For state that must stay small whatever a tool returned."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    size = len(text.encode())
    if size <= max_bytes:
        return value, None
    head = text.encode()[:max_bytes].decode("utf-8", errors="ignore")
    note = f"\n[truncated: the full result is {size} bytes; the first {len(head.encode())} are kept here]"
    return head + note, size


_BOUNDED_NOTE = re.compile(r"\n\[truncated: the full result is (\d+) bytes; the first \d+ are kept here\]\Z")


def split_bounded(text: str) -> tuple[str, int | None]:
    """``text`` without the note :func:`bounded` put at its end, and the full size that note names (None: the
    text was not cut). A reader that cuts the text again reports the whole cut, not only its own."""
    note = _BOUNDED_NOTE.search(text)
    if note is None:
        return text, None
    return text[: note.start()], int(note.group(1))


def bounded_outcome(outcome: ToolOutcome, max_bytes: int) -> ToolOutcome:
    """The outcome with its ``data`` in bounded form (what the planner keeps in its KV-stored run state)."""
    data, size = bounded(outcome.data, max_bytes)
    return outcome if size is None else outcome.model_copy(update={"data": data})
