"""Who may replay a run from the console, and how a model turn's system prompt is found by its hash
(``loopwarden.console.board.replay_refusal``, ``loopwarden.runtree``, ``services.planner.turns.sent``)."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

from loopwarden import runtree as T
from loopwarden.console import board as B
from loopwarden.replay import unrecorded_calls
from services.planner import turns
from services.planner.state import Iteration, RunState
from shared.messages import ChatMessage, RunSubmit, ToolContract
from shared.records import EventRecord, RunRecord, ToolCallExport
from shared.settings import Settings

ROSTER = {"alice": ["*"], "bob": ["not_judged", "approval"]}


def test_without_a_roster_every_operator_may_replay_as_the_queue_lets_every_operator_act() -> None:
    assert B.replay_refusal("anyone", None, live_tools=False) is None
    assert B.replay_refusal("anyone", None, live_tools=True) is None


def test_an_operator_off_the_roster_may_not_start_a_replay() -> None:
    why = B.replay_refusal("carol", ROSTER, live_tools=False)
    assert why == "replay: carol is not on the operators' roster (LW_OPERATORS), and a replay starts a run"


def test_running_real_tools_takes_an_operator_of_every_kind() -> None:
    assert B.replay_refusal("bob", ROSTER, live_tools=False) is None
    why = B.replay_refusal("bob", ROSTER, live_tools=True)
    assert why is not None and "an operator of every kind ('*'); bob has not_judged, approval" in why
    assert B.replay_refusal("alice", ROSTER, live_tools=True) is None


def state(model_calls: int, instructions: str = "") -> RunState:
    return RunState(
        run_id="run-u1",
        task="t",
        config=turns.resolve_config(RunSubmit(run_id="run-u1", task="t"), Settings(), {}).model_copy(
            update={"instructions": instructions}
        ),
        iteration=Iteration(n=1),
        model="m",
        messages=[ChatMessage.user("t")],
        model_calls=model_calls,
    )


def test_a_turn_records_its_system_prompt_by_hash_and_text_and_its_tools_only_when_they_changed() -> None:
    run = state(0, "Be brief.")
    offered = turns.Sent(turns.C.system_prompt(run), ("search",))
    first, later = turns.sent(run, offered), turns.sent(run, offered)
    assert first["system"].startswith("Be brief.\n\nYou are an agent") and first["tools_offered"] == ["search"]
    assert first["system_sha256"] == hashlib.sha256(first["system"].encode()).hexdigest()
    assert later == {}  # as the last turn: the run view reads that one (``sent_before``)
    changed = turns.sent(run, turns.Sent(offered.system + "\n- one more line", ("search",)))
    assert changed["system"].endswith("- one more line") and changed["system_sha256"] != first["system_sha256"]
    assert "tools_offered" not in changed
    fewer = turns.sent(run, turns.Sent(offered.system + "\n- one more line", ()))
    assert fewer == {"tools_offered": []}  # a turn offered no tools (a wrap-up): said, not inherited


def test_what_is_recorded_is_the_request_as_sent_with_progressive_disclosure() -> None:
    """Above the progressive-disclosure threshold the request's system prompt carries one more line and
    the tools are summaries: the turn records that request, not the run's base prompt."""
    run = state(0, "Be brief.")
    contracts = {
        name: ToolContract(
            name=name,
            description=f"{name}. It does things.",
            inputSchema={"type": "object"},
            outputSchema={"type": "object"},
        )
        for name in ("alpha", "beta", "gamma")
    }
    request = turns.C.model_request(run, contracts, "m", 100, progressive_above=1)
    recorded = turns.sent(run, turns.Sent.of(request))
    assert recorded["system"].endswith(turns.C.PROGRESSIVE_NOTE)
    assert recorded["tools_offered"] == [spec.name for spec in request.tools] != []


def record(details: list[dict[str, Any]]) -> RunRecord:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    events = [
        EventRecord(
            subject=f"lw.v1.evt.run.model_called.run-u1.{i}",
            kind="run.model_called",
            seq=i + 1,
            time=at,
            payload={"iteration": i + 1, "detail": {"model": "m", "input_tokens": 1, "output_tokens": 1, **d}},
        )
        for i, d in enumerate(details)
    ]
    return RunRecord(
        run_id="run-u1", exported_at=at, task="t", status="completed", provider="scripted", config={}, events=events
    )


def sent_of(rec: RunRecord, step: str) -> dict[str, T.Section]:
    return {s.key: s for s in T.step_detail(rec, step)}


def test_a_later_turn_shows_the_system_prompt_the_first_turn_carried() -> None:
    rec = record(
        [
            {"system_sha256": "abc", "system": "You are X.", "tools_offered": ["search"]},
            {"system_sha256": "abc", "tools_offered": ["search", "submit_answer"]},
        ]
    )
    sections = sent_of(rec, "i2.model")
    assert sections["system"].text == "You are X."
    assert sections["sent"].body["tools offered"] == ["search", "submit_answer"]
    assert sections["sent"].body["system"].startswith("sha256 abc")


def test_a_turn_that_names_neither_prompt_nor_tools_was_sent_what_the_last_turn_naming_them_was() -> None:
    rec = record(
        [
            {"system_sha256": "abc", "system": "You are X.", "tools_offered": ["search"]},
            {},
            {"tools_offered": ["search", "submit_answer"]},
            {},
        ]
    )
    second, fourth = sent_of(rec, "i2.model"), sent_of(rec, "i4.model")
    assert second["system"].text == fourth["system"].text == "You are X."
    assert second["sent"].body["tools offered"] == ["search"]
    assert fourth["sent"].body["tools offered"] == ["search", "submit_answer"]


def test_a_turn_whose_prompt_text_is_not_stored_says_so_and_an_older_turn_says_it_was_not_recorded() -> None:
    missing = sent_of(record([{"system_sha256": "abc"}]), "i1.model")
    assert "system" not in missing and "its text is on the run's first model turn" in missing["sent"].body["system"]
    old = sent_of(record([{}]), "i1.model")
    assert old["sent"].body["system"].startswith("not recorded")
    assert old["sent"].body["tools offered"] == "every registered tool"


def test_a_call_refused_before_any_tool_ran_is_no_unrecorded_output_but_a_call_with_no_attempt_is() -> None:
    rec = record([])
    refused = {"attempt_id": "run-u1.i1.c1", "iteration": 1, "call_id": "c1", "tool": "calculator"}
    rec.tool_calls = [
        ToolCallExport(**refused, outcome={"failure_type": "input_invalid"}),
        ToolCallExport(**{**refused, "attempt_id": "run-u1.i2.c2", "call_id": "c2"}, outcome=None),
    ]
    assert unrecorded_calls(rec) == ["calculator (call c2): no attempt recorded"]
