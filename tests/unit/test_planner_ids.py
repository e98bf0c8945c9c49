"""The planner's derived ids: one module builds them, each a pure function of the causing message."""

from __future__ import annotations

import re
from pathlib import Path

from services.planner import ids
from shared.messages import escalation_id_for_call

PLANNER = Path(__file__).resolve().parents[2] / "services" / "planner"


def test_every_message_id_is_the_same_for_the_same_cause_and_differs_by_kind() -> None:
    built = [
        ids.event("r", "run.started", 1, 1),
        ids.advance("r", 1),
        ids.tool_call("r", 1, "toolu_1"),
        ids.guard("r", 1),
        ids.cost_guard("r", 1),
        ids.judge_request("r", "r-c1"),
        ids.not_judged("r", "r-c1"),
        ids.loop("r", "repeat", 1, "toolu_1"),
        ids.escalation_raise("r", "esc-r-loop-1"),
        ids.answer_to_parent("r", "toolu_1"),
        ids.child_submit("r"),
    ]
    assert len(set(built)) == len(built)
    assert all(i.startswith("r.") for i in built)
    assert ids.tool_call("r", 1, "toolu_1") == ids.tool_call("r", 1, "toolu_1")


def test_call_scoped_ids_are_scoped_by_iteration() -> None:
    # a scripted or real model may reuse a call id in a later turn: a different message
    assert ids.tool_call("r", 1, "t") != ids.tool_call("r", 2, "t")
    assert ids.loop("r", "repeat", 1, "t") != ids.loop("r", "repeat", 2, "t")
    assert ids.outcome(1, "t") != ids.outcome(2, "t")
    assert ids.attempt("r", 1, "t") != ids.attempt("r", 2, "t")
    assert ids.call_escalation("r", 1, "t") != ids.call_escalation("r", 2, "t")


def test_event_ids_stay_unique_past_any_bound_on_remembered_messages() -> None:
    assert len({ids.event("r", "tool.dispatched", 3, n) for n in range(1, 2001)}) == 2000


def test_a_tool_failure_escalation_is_the_id_the_escalation_service_derives() -> None:
    assert ids.call_escalation("r", 2, "toolu_9") == escalation_id_for_call("r", 2, "toolu_9")
    assert ids.schema_cap_escalation("r", 2, "toolu_9") == escalation_id_for_call("r", 2, "toolu_9") + "-schema"


def test_applied_keys_name_the_message_they_answer() -> None:
    keys = [ids.SUBMIT, ids.advanced(1), ids.outcome(1, "t"), ids.verdict("r-c1"), ids.resolution("esc-1")]
    assert len(set(keys)) == len(keys)


def test_no_planner_phase_builds_a_derived_id_itself() -> None:
    """Ids are built in ids.py only: an f-string id elsewhere is a second format to keep in step."""
    pattern = re.compile(r'f"(\{[a-z_.]*run_id\}[-.]|esc-|advance\.|verdict\.|outcome\.|resolution\.)')
    found = [
        f"{path.name}:{n}"
        for path in sorted(PLANNER.glob("*.py"))
        if path.name != "ids.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert found == []
