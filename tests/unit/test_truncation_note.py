"""The model is told how much of a long tool result it did not see, in total (issue 28, item 9).

The planner keeps a bounded copy of a result in its run state (``bounded_outcome``: 16 KiB with a note);
rendering it for the model cuts it again to the token budget. That second cut used to drop the first note,
so a 1.37 MB output read "550 more tokens were cut"."""

from __future__ import annotations

import json
import re

from services.planner.context import render_outcome
from shared import tokens
from shared.bounded import bounded_outcome, split_bounded
from shared.messages import ToolOutcome


def _outcome(data: object) -> ToolOutcome:
    return ToolOutcome.model_validate(
        {
            "run_id": "run-1",
            "iteration": 1,
            "call_id": "c1",
            "attempt_id": "a1",
            "tool": "search",
            "requested_tool": "search",
            "success": True,
            "data": data,
        }
    )


def test_a_large_output_cut_twice_reports_the_whole_cut() -> None:
    rows = [{"id": i, "title": f"result number {i}", "body": "lorem ipsum dolor sit amet " * 4} for i in range(9000)]
    full = len(json.dumps(rows, ensure_ascii=False).encode())
    assert full > 1_300_000
    kept = bounded_outcome(_outcome(rows), 16 * 1024)  # what the run state holds
    text, is_error = render_outcome(kept, 4000)  # what the model reads
    assert not is_error
    note = re.search(r"you see the first (\d+) of its (\d+) bytes; about (\d+) more tokens were cut", text)
    assert note is not None, text[-300:]
    shown, whole, unseen = (int(g) for g in note.groups())
    assert whole == full and shown <= 16 * 1024
    whole_tokens = tokens.count(json.dumps(rows, ensure_ascii=False))
    # the estimate is of the right size: within a fifth of the tokens really not shown
    assert abs(unseen - (whole_tokens - 4000)) < 0.2 * whole_tokens, (unseen, whole_tokens)
    assert "[truncated: the full result" not in text  # the first note is folded into the one the model reads


def test_a_bounded_copy_that_fits_the_budget_still_says_it_was_cut() -> None:
    kept = bounded_outcome(_outcome("x" * 40_000), 1024)
    text, _ = render_outcome(kept, 100_000)
    assert "of its 40000 bytes" in text


def test_an_output_that_was_never_bounded_keeps_the_token_note() -> None:
    text, _ = render_outcome(_outcome("word " * 5000), 100)
    assert re.search(r"\[result truncated: \d+ more tokens were cut", text)
    assert split_bounded("plain text") == ("plain text", None)
