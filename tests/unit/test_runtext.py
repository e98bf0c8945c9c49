"""The run view and a queue item as terminal text (``loopwarden.runtext``), from recorded runs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from loopwarden import runtree as T
from loopwarden.runtext import escalation_lines, step_lines, tree_lines
from shared.messages import Escalation
from shared.records import RunRecord

DATA = Path(__file__).parent / "data"


def record(name: str) -> RunRecord:
    return RunRecord.model_validate_json((DATA / f"run-{name}.json").read_text())


def test_the_tree_has_the_outcome_on_top_and_a_line_per_step_with_its_id() -> None:
    lines = tree_lines(T.build(record("demo")))
    assert lines[:4] == [
        "run:      run-c0f307071b2a4803a508",
        "status:   completed",
        "decide:   row 5: complete — terminal tool ran in this iteration",
        "ended:    terminal tool ran in this iteration",
    ]
    judge = next(i for i, line in enumerate(lines) if line.strip().startswith("judge "))
    assert "298→66 tok" in lines[judge] and "[i3.judge]" in lines[judge + 1]


def test_a_long_summary_is_cut_at_a_word_with_an_ellipsis() -> None:
    tree = T.build(record("malformed-output-corrected"))
    step = tree.find("i1.tool.toolu_001_01")
    assert step is not None
    cut = next(line for line in tree_lines(tree) if "[i1.tool.toolu_001_01]" in line)
    text = cut.strip().rsplit("  [", 1)[0]
    assert text.endswith("…") and len(text) <= 100
    whole = " ".join(step.summary.split())
    assert whole.startswith(text[:-1]) and whole[len(text) - 1] == " "  # cut where a word ends


def test_a_step_is_printed_whole() -> None:
    rec = record("malformed-output-corrected")
    tree = T.build(rec)
    step = tree.find("i1.tool.toolu_001_01")
    assert step is not None
    text = "\n".join(step_lines(step, T.step_detail(rec, step.id)))
    assert "── Raw output (before validation) ──" in text and '"score": 0.7' in text
    assert "Schema:" in text  # what the model saw, not cut


def test_an_item_reads_as_the_console_shows_it() -> None:
    rec = record("correction-escalates")
    item = Escalation.model_validate(rec.escalations[0])
    lines = escalation_lines(item, now=item.created_at + timedelta(seconds=10))
    assert lines[0] == f"escalation: {item.escalation_id}"
    assert "kind:       schema_cap   tool: calculator   failure: input_invalid" in lines
    assert "SLA:        abort at 20:57:29 (in 59 m 50 s)" in lines
    assert "── Arguments ──" in lines and '  "expr": "1+1"' in lines
    assert any(line.startswith("assistant: → calculator") for line in lines)
    assert datetime.now(UTC) > item.created_at


def test_a_stalled_run_says_why_and_how_it_moves_on() -> None:
    rec = record("demo")
    stall = {"reason": "planner gave up on lw.v1.cmd.run.advance (dead letter 7): HTTP 500", "letters": [7]}
    stalled = rec.model_copy(
        update={
            "status": "stalled",
            "final_reason": None,
            "state": {**(rec.state or {}), "stall": {**stall, "escalation_id": "esc-1"}},
        }
    )
    lines = tree_lines(T.build(stalled))
    assert lines[1] == "status:   stalled"
    assert lines[3] == (
        "ended:    stalled: planner gave up on lw.v1.cmd.run.advance (dead letter 7): HTTP 500; hand it back: "
        "loopwarden dlq requeue 7, or resolve esc-1 in the queue"
    )
    missing = {"reason": "no live validator replica", "letters": [], "missing": "validator"}
    assert T.stall_line(missing) == "no live validator replica; it moves on by itself once one is back"
