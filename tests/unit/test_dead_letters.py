"""Dead letters as data: which can be handed back, what travels with them, which consumer takes them."""

from __future__ import annotations

import pytest

from shared import subjects as S
from shared.dead_letters import (
    BODY_LIMIT,
    carried_headers,
    letter_body,
    not_ours,
    refusal,
    requeue_command,
    requeue_msg_id,
    superseded,
    taker,
)
from shared.messages import DeadLetter


def letter(subject: str, body: str = '{"run_id": "run-1"}', **extra: object) -> DeadLetter:
    fields: dict[str, object] = {"requeue_to": S.requeue("planner"), **extra}
    return DeadLetter(service="planner", subject=subject, reason="still not ready", body=body, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "subject",
    [
        S.RUN_ADVANCE,  # a command
        S.tool_execute("search"),
        f"{S.tool_succeeded('calculator')}.run-1",  # an event a service consumed
        f"{S.FAILURE_PREFIX}.fatal.search.run-1",
    ],
)
def test_commands_and_events_can_be_handed_back(subject: str) -> None:
    assert refusal(7, letter(subject)) is None


def test_a_request_reply_letter_cannot_be_handed_back_and_says_why() -> None:
    why = refusal(3, letter(S.BUDGET_RESERVE))
    assert why is not None and why.startswith("letter 3 is a request on lw.v1.rpc.budget.reserve")
    assert "core NATS request/reply" in why and "caller" in why


def test_an_unreadable_requeue_is_not_requeued_itself() -> None:
    why = refusal(9, letter(S.requeue("planner"), body="{not json"))
    assert why is not None and "requeue the letter it was made from" in why


def test_a_letter_whose_body_was_cut_cannot_be_handed_back_whole() -> None:
    data = b'{"x": "' + b"a" * (BODY_LIMIT + 10) + b'"}'
    body = letter_body(data)
    assert body.endswith(f"... [{len(data)} bytes, cut to {BODY_LIMIT}]")
    why = refusal(5, letter(S.RUN_ADVANCE, body=body))
    assert why is not None and f"first {BODY_LIMIT} of the message's {len(data)} bytes" in why
    assert letter_body(b'{"small": 1}') == '{"small": 1}'


def test_the_message_travels_back_with_its_own_headers_but_not_the_servers_controls() -> None:
    headers = {
        "Lw-Run-Id": "run-1",
        "traceparent": "00-abc-def-01",
        "Lw-Payload-Ref": "sha256:x",
        "Nats-Msg-Id": "advance.run-1.1",
        "Nats-Expected-Stream": "LW_EVT",
    }
    assert carried_headers(headers) == {
        "Lw-Run-Id": "run-1",
        "traceparent": "00-abc-def-01",
        "Lw-Payload-Ref": "sha256:x",
    }
    assert requeue_command(12).model_dump() == {"letter": 12}  # the letter's number, nothing of the message
    # a requeue's id: the letter's, and nothing a client could send first (N4)
    assert requeue_msg_id(12).startswith("requeue-12-") and requeue_msg_id(12) != requeue_msg_id(12)


def test_a_service_runs_only_a_letter_it_stored_itself() -> None:
    """The command names a letter; the service reads it from LW_DLQ and runs it only if it is stored on the
    service's own dead-letter subject (which only that service may publish on) and names the service."""
    own = letter(S.RUN_ADVANCE)
    assert not_ours(7, S.dead_letter("planner"), own, "planner") is None
    why = not_ours(7, S.dead_letter("planner"), own, "executor")
    assert why == f"letter 7 was dead-lettered by planner (on {S.dead_letter('planner')}), not by executor"
    # a letter claiming to be the executor's but stored on the planner's subject is not the executor's
    assert not_ours(7, S.dead_letter("planner"), own.model_copy(update={"service": "executor"}), "executor")
    # a letter of its own that cannot be handed back is still refused, with the same reason the CLI gives
    request = letter(S.BUDGET_RESERVE)
    assert not_ours(8, S.dead_letter("planner"), request, "planner") == refusal(8, request)


def test_the_consumer_whose_filter_takes_the_subject_runs_it() -> None:
    planner = [
        (S.DURABLE_PLANNER_ADVANCE, (S.RUN_ADVANCE,)),
        (S.DURABLE_PLANNER_OUTCOMES, (f"{S.TOOL_SUCCEEDED_PREFIX}.>", f"{S.FAILURE_PREFIX}.*.*.*")),
    ]
    assert taker(planner, S.RUN_ADVANCE) == S.DURABLE_PLANNER_ADVANCE
    assert taker(planner, f"{S.tool_succeeded('calculator')}.run-1") == S.DURABLE_PLANNER_OUTCOMES
    assert taker(planner, f"{S.FAILURE_PREFIX}.fatal.search.run-1") == S.DURABLE_PLANNER_OUTCOMES
    assert taker(planner, S.JUDGE_SCORE) is None
    executor = [(S.executor_durable("search"), (S.tool_execute("search"),))]
    assert taker(executor, S.tool_execute("charge_card")) is None  # another replica may host it


@pytest.mark.parametrize(
    ("pattern", "subject", "matches"),
    [
        ("a.b", "a.b", True),
        ("a.b", "a.b.c", False),
        ("a.*", "a.b", True),
        ("a.*", "a.b.c", False),
        ("a.>", "a.b.c", True),
        ("a.>", "a", False),
        ("a.*.c", "a.x.c", True),
        ("a.*.c", "a.x.d", False),
        ("a.b.c", "a.b", False),
    ],
)
def test_subject_patterns_match_as_nats_matches_them(pattern: str, subject: str, matches: bool) -> None:
    assert S.matches(pattern, subject) is matches


def test_a_subjects_stream_is_the_one_whose_patterns_match_it() -> None:
    """``stream_for`` looks streams up by exact name and prefix: the same answers as matching every pattern."""

    def by_matching(subject: str) -> str | None:
        found = [s for s, patterns in S.STREAM_SUBJECTS.items() if any(S.matches(p, subject) for p in patterns)]
        return found[0] if found else None

    patterns = [p for ps in S.STREAM_SUBJECTS.values() for p in ps]
    asked = [*patterns, *(p.replace(">", "x.y") for p in patterns), *(p + ".extra" for p in patterns)]
    asked += ["lw.v1.evt.run.completed.run-1", "lw.v1.cmd.run", "lw.v1.rpc.budget", "lw.v1.evt", "lw.v1.*.run.advance"]
    for subject in asked:
        assert S.stream_for(subject) == by_matching(subject), subject
    assert S.stream_for("lw.v1.evt.>") == S.STREAM_EVT  # a pattern one stream covers
    assert S.stream_for("lw.v1.evt.run.*.r1") == S.STREAM_EVT
    assert S.stream_for("lw.v1.cmd.tool.execute.search") == S.STREAM_CMD
    assert S.stream_for("lw.v1.rpc.budget") is None


def test_the_requeue_durable_cannot_be_a_tools_durable() -> None:
    assert S.requeue_durable("executor") != S.executor_durable("requeue")
    assert S.requeue("executor") == "lw.v1.cmd.requeue.executor"
    assert S.stream_for(S.requeue("executor")) == S.STREAM_SUBMIT


def test_a_letter_names_the_consumer_that_took_it_and_a_request_names_none() -> None:
    from shared.bus import ack_consumer

    assert ack_consumer("$JS.ACK.LW_CMD.executor_search.3.41.7.1700000000000000000.0") == "executor_search"
    assert ack_consumer("$JS.ACK.hub.ACCHASH.LW_EVT.planner_outcomes.1.9.2.1700000000000000000.0.tok") == (
        "planner_outcomes"
    )
    assert ack_consumer("_INBOX_client.abc") is None and ack_consumer(None) is None
    # where that consumer's letters go back: the executor's per hosted tool, everyone else's per service
    assert S.requeue("executor", "search") == "lw.v1.cmd.requeue.executor.search"
    assert S.requeue_durable("executor", "search") == "requeue_executor_search"
    assert S.requeue_durable("planner") == "requeue_planner"


def test_a_letter_that_names_no_way_back_or_another_services_is_refused() -> None:
    why = refusal(4, letter(S.RUN_ADVANCE, requeue_to=None))
    assert why == "letter 4 names no consumer of planner to hand it back to (requeue_to: None)"
    assert refusal(4, letter(S.RUN_ADVANCE, requeue_to=S.requeue("executor", "search"))) is not None
    assert refusal(4, letter(S.RUN_ADVANCE, requeue_to=S.requeue("planner") + "x")) is not None


def test_a_letter_that_failed_again_is_handed_back_as_its_newest_letter_only() -> None:
    later = [(6, letter(S.RUN_ADVANCE)), (9, letter(S.RUN_ADVANCE, requeued_from=5))]
    assert superseded(5, later) == "letter 5 was handed back and failed again as letter 9: requeue letter 9"
    assert superseded(6, later) is None
