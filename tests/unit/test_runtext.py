"""The run view and a queue item as terminal text (``loopwarden.runtext``), from recorded runs."""

from __future__ import annotations

import re
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
    assert re.search(r"── Raw output \(before validation, \d+ bytes\) ──", text) and '"score": 0.7' in text
    assert "Schema:" in text  # what the model saw, not cut


def test_a_tool_output_left_by_reference_shows_its_size() -> None:
    from loopwarden.runtree.detail import by_reference, output_size, size_text

    ref = {"name": "sha256-ab", "size": 5 * 1024 * 1024, "sha256": "ab", "owner": "executor"}
    assert by_reference(ref) == (5 * 1024 * 1024, "ab") and by_reference({"$lw_payload_ref": ref}) is not None
    assert output_size(ref) == 5 * 1024 * 1024 and size_text(output_size(ref)) == "5.0 MB"
    assert by_reference({"size": 3}) is None and output_size("héllo") == 6 and output_size({"a": 1}) == 7


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


def test_an_item_whose_tool_has_no_contract_does_not_offer_a_provided_result() -> None:
    rec = record("correction-escalates")
    item = Escalation.model_validate(rec.escalations[0])
    assert "provide_result" in item.allowed_actions
    offered = next(line for line in escalation_lines(item) if line.startswith("allowed:"))
    assert "provide_result" in offered
    lines = escalation_lines(item, no_contract=True)
    offered = next(line for line in lines if line.startswith("allowed:"))
    assert "provide_result" not in offered and "resume" in offered
    assert "(provide_result is not offered: no output contract is registered for 'calculator')" in "\n".join(lines)
