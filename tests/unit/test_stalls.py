"""Nothing silent, as plain functions (``services/planner/stalls.py``): a run held up by a dead letter or a missing
replica is stalled with the reason and moves on again; the record says ``stalled`` while the rules read the
status underneath; a refused submit is a final record."""

from __future__ import annotations

from datetime import timedelta

from services.planner import ids, stalls
from services.planner.escalations import apply_resolution
from services.planner.outbox import Outbox
from services.planner.state import RunState
from services.planner.transaction import apply_message
from services.planner.turns import resolve_config
from shared import subjects as S
from shared.dead_letters import run_of, submitted_run
from shared.messages import (
    DeadLetter,
    EscalationRaise,
    EscalationResolution,
    EscalationWithdraw,
    LetterHandled,
    ReplicaRecord,
    Requeue,
    RunEvent,
    RunSnapshot,
    RunSubmit,
    utcnow,
)
from shared.replicas import Fleet, alive
from shared.settings import Settings
from tests.support.transitions import new_run, outcome, turn

NOW = utcnow()


def letter(subject: str = S.RUN_ADVANCE, run_id: str = "r1", **fields: object) -> DeadLetter:
    defaults: dict[str, object] = {
        "service": "planner",
        "subject": subject,
        "reason": "still not ready after 2 deliveries: model provider unavailable (HTTP 500)",
        "body": f'{{"run_id": "{run_id}", "iteration": 1}}',
        "headers": {"Lw-Run-Id": run_id},
        "requeue_to": S.requeue("planner"),
    }
    return DeadLetter(**{**defaults, **fields})  # type: ignore[arg-type]


def kinds(out: Outbox) -> list[str]:
    skip = ("RunAdvance", "ToolCall", "EscalationRaise", "EscalationWithdraw", "Requeue")
    return [RunEvent.model_validate_json(i.payload).root.kind for i in out.items if i.model not in skip]


def of(out: Outbox, model: type) -> list:  # type: ignore[type-arg]
    return [model.model_validate_json(i.payload) for i in out.items if i.model == model.__name__]


def stalled_on(state: RunState, seq: int, **kw: object) -> Outbox:
    out = stalls.held_up_by(state, seq, letter(**kw), requeue_to=S.requeue("planner"), now=NOW)  # type: ignore[arg-type]
    assert out is not None
    return out


# --- a dead letter ---------------------------------------------------------------------------------------------
def test_a_dead_letter_stalls_the_run_with_the_reason_an_event_and_a_queue_item() -> None:
    state = new_run()
    out = stalled_on(state, 7)
    assert state.stall is not None and state.stall.letters == [7] and state.status == "running"  # underneath
    assert state.stall.reason.startswith(f"planner gave up on {S.RUN_ADVANCE} (dead letter 7): still not ready")
    assert kinds(out) == ["stalled"]
    (item,) = of(out, EscalationRaise)
    assert (item.kind, item.escalation_id, item.details["letter"]) == ("stalled", ids.stalled_escalation("r1", 7), 7)
    assert state.stall.escalation_id == item.escalation_id
    event = RunEvent.model_validate_json(next(i.payload for i in out.items if i.model == "Stalled")).root
    assert event.status == "stalled"


def test_the_record_says_stalled_and_reads_back_to_the_status_underneath() -> None:
    state = new_run()
    stalled_on(state, 7)
    stored = state.model_dump_json()
    assert RunSnapshot.model_validate_json(stored).status == "stalled"  # what every reader sees
    back = RunState.model_validate_json(stored)
    assert back.status == "running" and back.stall is not None and back.stall.letters == [7]
    state.stall = None
    assert RunSnapshot.model_validate_json(state.model_dump_json()).status == "running"


def test_a_letter_known_or_of_an_ended_run_changes_nothing() -> None:
    state = new_run()
    stalled_on(state, 7)
    assert stalls.held_up_by(state, 7, letter(), requeue_to=None, now=NOW) is None
    ended = new_run()
    turn(ended, "the answer")
    assert ended.done and stalls.held_up_by(ended, 8, letter(), requeue_to=None, now=NOW) is None


def test_the_queues_own_letter_stalls_the_run_without_asking_the_queue_again() -> None:
    state = new_run()
    out = stalled_on(state, 7, subject=S.ESCALATION_RAISE, service="escalation", requeue_to=S.requeue("escalation"))
    assert state.stall is not None and state.stall.letters == [7] and state.stall.escalation_id is None
    assert kinds(out) == ["stalled"] and of(out, EscalationRaise) == []  # an item it failed on would be a letter too


def test_a_letter_requeued_and_failed_again_replaces_the_one_it_came_from() -> None:
    state = new_run()
    stalled_on(state, 7)
    out = stalled_on(state, 9, requeued_from=7)
    assert state.stall is not None and state.stall.letters == [9]
    assert [w.escalation_id for w in of(out, EscalationWithdraw)] == [ids.stalled_escalation("r1", 7)]


def test_the_letter_handled_moves_the_run_on_and_closes_its_item() -> None:
    state = new_run()
    stalled_on(state, 7)
    assert stalls.letter_handled(state, LetterHandled(letter=8, service="planner", subject="x")) is None
    out = stalls.letter_handled(state, LetterHandled(letter=7, service="planner", subject=S.RUN_ADVANCE))
    assert out is not None and state.stall is None and kinds(out) == ["unstalled"]
    assert [w.escalation_id for w in of(out, EscalationWithdraw)] == [ids.stalled_escalation("r1", 7)]


def test_a_run_stalled_on_two_letters_moves_on_once_both_are_handled() -> None:
    state = new_run()
    stalled_on(state, 7)
    stalled_on(state, 8)
    out = stalls.letter_handled(state, LetterHandled(letter=8, service="executor", subject="x"))
    assert out is not None and kinds(out) == [] and state.stall is not None and state.stall.letters == [7]
    assert state.stall.escalation_id == ids.stalled_escalation("r1", 7)  # the remaining letter's item
    out = stalls.letter_handled(state, LetterHandled(letter=7, service="planner", subject="x"))
    assert out is not None and kinds(out) == ["unstalled"] and state.stall is None


def test_another_message_applied_does_not_end_a_stall_on_a_letter() -> None:
    state = new_run()
    turn(state, "", ("c1", "search", {}), ("c2", "lookup", {}))
    stalled_on(state, 7, subject=S.tool_execute("lookup"))  # c2's command was dead-lettered
    applied = apply_message(state, ids.outcome(1, "c1"), lambda s: outcome(s, "c1"))
    assert applied is not None and state.stall is not None and state.stall.letters == [7]


def test_the_item_requeue_hands_the_letter_back_and_abort_stops_the_run() -> None:
    state = new_run()
    stalled_on(state, 7)
    item = ids.stalled_escalation("r1", 7)
    res = EscalationResolution(escalation_id=item, run_id="r1", action="requeue", resolved_by="alice")
    out = apply_resolution(state, res)
    (sent,) = [i for i in out.items if i.model == "Requeue"]
    assert (sent.subject, Requeue.model_validate_json(sent.payload).letter) == (S.requeue("planner"), 7)
    # its own id: the same for a redelivered resolution, not one a client could guess and send first
    assert sent.msg_id == ids.stall_requeue(7, item, "alice", res.resolved_at.isoformat())
    assert sent.msg_id.startswith("requeue-7-") and len(sent.msg_id) == len("requeue-7-") + 32
    assert state.stall is not None  # until the letter is handled
    stopped = new_run()
    stalled_on(stopped, 7)
    res = EscalationResolution(escalation_id=item, run_id="r1", action="abort", note="gone", resolved_by="bob")
    out = apply_resolution(stopped, res)
    assert stopped.status == "stopped" and stopped.stall is None and stopped.final_reason == "aborted by bob: gone"
    assert kinds(out) == ["stopped"]


def test_a_requeue_of_a_letter_that_cannot_be_handed_back_ends_the_run_saying_why() -> None:
    state = new_run()
    out = stalls.held_up_by(state, 7, letter(), requeue_to=None, now=NOW)
    assert out is not None and state.stall is not None and state.stall.reason.endswith("it cannot be handed back")
    item = ids.stalled_escalation("r1", 7)
    apply_resolution(state, EscalationResolution(escalation_id=item, run_id="r1", action="requeue", resolved_by="al"))
    assert state.status == "failed" and state.stall is None
    assert (state.final_reason or "").endswith("al asked to requeue it, but it cannot be handed back")


def test_a_run_that_ends_is_stalled_no_more_and_its_items_are_withdrawn() -> None:
    state = new_run()
    stalled_on(state, 7)
    applied = apply_message(state, "m", lambda s: turn(s, "the answer"))
    assert applied is not None and state.done and state.stall is None
    assert [i.model for i in applied.items].count("EscalationWithdraw") == 1


# --- a service with no live replica ---------------------------------------------------------------------------
def test_what_a_run_waits_on_follows_from_its_state() -> None:
    state = new_run()
    assert [n.label for n in stalls.needs(state)] == ["governor"]  # its next turn's budget
    turn(state, "", ("c1", "search", {}))
    assert [(n.label, n.durable) for n in stalls.needs(state)] == [
        ("executor hosting search", S.executor_durable("search")),
        ("validator", None),
    ]
    state.status = "awaiting_human"
    assert [n.service for n in stalls.needs(state)] == ["escalation"]


def test_a_run_waiting_past_the_bound_on_a_service_with_no_replica_is_stalled_until_its_work_moves() -> None:
    state = new_run()
    turn(state, "", ("c1", "search", {}))
    fleet = Fleet.of([ReplicaRecord(service="executor", instance="e1", durables=[S.executor_durable("search")])])
    need = stalls.first_missing(stalls.needs(state), fleet)
    assert need is not None and need.label == "validator"
    assert stalls.missing_replica(state, need, now=state.updated_at, after_s=60) is None  # within the bound
    out = stalls.missing_replica(state, need, now=state.updated_at + timedelta(seconds=61), after_s=60)
    assert out is not None and kinds(out) == ["stalled"] and not of(out, EscalationRaise)  # nothing to ask a person
    assert state.stall is not None and state.stall.reason == "no live validator replica"
    applied = apply_message(state, ids.outcome(1, "c1"), lambda s: outcome(s, "c1"))
    assert applied is not None and state.stall is None and "unstalled" in kinds(Outbox(state, applied.items))


def test_replicas_not_heard_from_within_the_ttl_are_gone() -> None:
    fresh = ReplicaRecord(service="validator", instance="a", seen_at=NOW)
    stale = ReplicaRecord(service="judge", instance="b", seen_at=NOW - timedelta(seconds=31))
    live = alive([fresh, stale], NOW, 30)
    assert live == [fresh] and Fleet.of(live).serves("validator") and not Fleet.of(live).serves("judge")


# --- which run a letter holds up, and a refused submit ------------------------------------------------------
def test_a_letter_names_its_run_only_when_a_service_published_the_message() -> None:
    assert run_of(letter()) == "r1"
    spawn = letter(S.RUN_SPAWN, body='{"run_id": "child", "parent_run_id": "parent"}', headers={})
    assert run_of(spawn) == "parent"  # the parent waits for a child that never started
    forged = letter(S.run_submit("acme"), headers={"Lw-Run-Id": "victim"})  # a client wrote this header
    assert run_of(forged) is None
    assert run_of(letter(S.BUDGET_RESERVE)) is None  # a request: no stream, no run waits on it


def test_a_refused_submit_names_its_run_and_the_tenant_the_server_let_it_submit_for() -> None:
    bad = letter(S.run_submit("acme"), body='{"run_id": "run-x", "task": ' + "[" * 5000, headers={})
    assert submitted_run(bad) == ("run-x", "acme")
    assert submitted_run(letter(S.run_submit("acme"), body="not json", headers={})) is None
    replayed = letter(S.run_replay("acme"), body='{"run_id": "run-y", "task": 1}', headers={})
    assert submitted_run(replayed) == ("run-y", "acme")  # an operator's replay of one of acme's runs
    config = resolve_config(RunSubmit(run_id="run-x", task="t", tenant="acme"), Settings(), {})
    out = stalls.refused("run-x", "acme", "t", "does not match contract RunSubmit", config)
    assert out.state.status == "refused" and out.state.done and kinds(out) == ["refused"]
    assert out.state.outbox[ids.REFUSED] == out.items  # kept: a crash before publishing publishes it again
