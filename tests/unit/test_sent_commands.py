"""Which commands a finished run's planner removes (``services.planner.removals.SentCommands``, ``ids.handled_by``):
only its own advances, tool calls and judge requests whose outcome is applied; the others are left to the sweep."""

from __future__ import annotations

from services.planner import ids
from services.planner.removals import SentCommands
from shared.bus.wire import _PubAck


def ack(seq: int) -> _PubAck:
    return _PubAck("LW_CMD", seq, False)


def test_a_command_is_handled_by_its_outcome() -> None:
    run = "run-1"
    assert ids.handled_by(run, ids.advance(run, 2)) == ("advance.2",)
    assert ids.handled_by(run, ids.tool_call(run, 3, "toolu_1.x")) == (
        "outcome.3.toolu_1.x",
        "outcome.3.toolu_1.x.unknown",
    )
    assert ids.handled_by(run, ids.judge_request(run, "run-1-c3")) == ("verdict.run-1-c3",)
    for other in (ids.event(run, "decided", 1, 2), ids.child_submit("run-2"), ids.tool_call("run-2", 1, "c"), "x"):
        assert ids.handled_by(run, other) == (), other


def test_only_the_handled_commands_of_the_ended_run_are_given_and_the_run_is_forgotten() -> None:
    sent = SentCommands(runs=2)
    run = "run-1"
    msg_ids = [ids.advance(run, 1), ids.tool_call(run, 1, "c1"), ids.tool_call(run, 2, "c2"), None]
    sent.published(run, msg_ids, [ack(10), ack(11), ack(12), ack(13)])
    sent.published(run, [ids.judge_request(run, "run-1-c2")], [ack(14)])
    applied = ["submit", "advance.1", "outcome.1.c1", "outcome.2.c2.unknown"]  # the judge's verdict never came
    assert sent.ended(run, applied) == [10, 11, 12]
    assert sent.ended(run, applied) == []  # forgotten
    for n in range(3):  # at most ``runs`` runs remembered: the oldest are left to the sweep
        sent.published(f"run-{n + 10}", [ids.advance(f"run-{n + 10}", 1)], [ack(n + 1)])
    assert sent.ended("run-10", ["advance.1"]) == [] and sent.ended("run-12", ["advance.1"]) == [3]
