"""A run that stopped moving, and moving on again (issue 35: nothing silent). No bus, no I/O; time passed in.

A run is ``stalled`` (not final) when

* a message of it was dead-lettered (``held_up_by``): any service's - the planner's own turn, an executor's tool
  command, a validator's result, the judge's request, the queue's raise - once the letter says which run it held
  up (``shared.dead_letters.run_of``). A person can help, so a queue item is raised (kind ``stalled``: requeue
  the letter, or abort the run); the run moves on when the letter is handed back and handled (``letter_handled``:
  the service that handled it says so on ``evt.letter.handled``), whoever handed it back;
* it has not moved for ``LW_STALL_AFTER_S`` while a service it needs has no live replica (``missing_replica``,
  from the planner's sweep over the replica registry: ``needs``, ``first_missing``). It moves on when its work
  does: the next message applied to it ends that stall (``moved``).

In memory the run keeps the status it has underneath (``running``, ``awaiting_human``), which every other rule
reads; the stored record says ``stalled`` and why (``RunState``'s serializer, ``Stall``). A run that ends is not
stalled, and its open item is withdrawn. A submit refused before it started is a ``refused`` record
(``refused``), so its submitter's wait ends with the reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from services.planner import ids
from services.planner.delegation import DELEGATE
from services.planner.outbox import Outbox, finish
from services.planner.state import Iteration, RunConfig, RunState, Stall
from shared import subjects as S
from shared.dead_letters import requeue_command
from shared.messages import (
    DeadLetter,
    EscalationDetails,
    EscalationRaise,
    EscalationResolution,
    EscalationWithdraw,
    LetterHandled,
    ReasonDetail,
    Refusal,
    Resumed,
    ResumedDetail,
    Stalled,
    StalledDetail,
    Unstalled,
)
from shared.replicas import Fleet

REASON_CHARS = 500


def _cut(text: str, n: int = REASON_CHARS) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _stalled_event(out: Outbox, summary: str, detail: StalledDetail) -> None:
    head = out.head(_cut(summary, 300))
    head["status"] = "stalled"
    out.event(Stalled(**head, detail=detail))


def _raise_item(out: Outbox, reason: str, seq: int, letter: DeadLetter) -> EscalationRaise:
    s = out.state
    raised = EscalationRaise(
        escalation_id=ids.stalled_escalation(s.run_id, seq),
        run_id=s.run_id,
        kind="stalled",
        reason=reason,
        details=EscalationDetails(letter=seq, service=letter.service, subject=letter.subject[:512]),
        tenant=s.tenant,  # whose item it is (the escalation service reads no run record)
    )
    out.add(S.ESCALATION_RAISE, raised, ids.escalation_raise(s.run_id, raised.escalation_id))
    return raised


def _withdraw(out: Outbox, letters: list[int], reason: str) -> None:
    """The queue items of ``letters`` are not needed any more (an item resolved already stays as it is)."""
    s = out.state
    for seq in letters:
        escalation_id = ids.stalled_escalation(s.run_id, seq)
        raised = EscalationRaise(
            escalation_id=escalation_id, run_id=s.run_id, kind="stalled", reason=reason, tenant=s.tenant
        )
        out.add(
            S.ESCALATION_WITHDRAW,
            EscalationWithdraw(escalation_id=escalation_id, run_id=s.run_id, reason=reason, raised=raised),
            ids.escalation_withdraw(s.run_id, escalation_id),
        )


# --- a dead letter --------------------------------------------------------------------------------------------
def held_up_by(
    state: RunState, seq: int, letter: DeadLetter, *, requeue_to: str | None, now: datetime
) -> Outbox | None:
    """Letter ``seq`` holds a message of the run: the run is stalled on it, with a queue item to requeue it (or to
    abort). ``requeue_to``: where it is handed back (None: it cannot be, ``dead_letters.refusal``). A letter
    requeued from an earlier one replaces it. None: nothing changes (the run ended, or knows the letter)."""
    before = state.stall
    if state.done or (before is not None and seq in before.letters):
        return None
    out = Outbox(state)
    known = before.letters if before else []
    superseded = [n for n in known if n == letter.requeued_from]
    withdrawn = [n for n in (before.asked if before else []) if n in superseded]
    letters = [*(n for n in known if n not in superseded), seq]
    reason = _cut(f"{letter.service} gave up on {S.stem(letter.subject)} (dead letter {seq}): {letter.reason}")
    if requeue_to is None:
        reason = _cut(f"{reason}; it cannot be handed back")
    handed = {n: to for n, to in (before.requeue_to if before else {}).items() if n in letters}
    if requeue_to is not None:
        handed[seq] = requeue_to
    _withdraw(out, withdrawn, f"dead letter {letter.requeued_from} was handed back and failed again as {seq}")
    # The queue's own letter (a raise, a withdraw it could not take) asks it for nothing more: an item it fails
    # on too would be one more letter, for ever. ``loopwarden dlq requeue`` hands such a letter back.
    raised = _raise_item(out, reason, seq, letter) if letter.service != "escalation" else None
    asked = [n for n in (before.asked if before else []) if n in letters] + ([seq] if raised else [])
    state.stall = Stall(
        reason=reason,
        letters=letters,
        missing=before.missing if before else None,
        escalation_id=raised.escalation_id if raised else None,
        since=before.since if before else now,
        requeue_to=handed,
        asked=asked,
    )
    _stalled_event(
        out,
        f"stalled: {reason}",
        StalledDetail(
            reason=reason,
            letter=seq,
            service=letter.service[:64],
            subject=letter.subject[:512],
            escalation_id=raised.escalation_id if raised else None,
        ),
    )
    return out


def letter_handled(state: RunState, handled: LetterHandled) -> Outbox | None:
    """Letter ``handled.letter`` was handed back and handled: the run waits on it no more (None: it did not)."""
    before = state.stall
    if before is None or handled.letter not in before.letters or state.done:
        return None
    out = Outbox(state)
    letters = [n for n in before.letters if n != handled.letter]
    said = f"dead letter {handled.letter} was handed back to {handled.service} and handled"
    _withdraw(out, [n for n in before.asked if n == handled.letter], said)
    if not letters and before.missing is None:
        state.stall = None
        out.event(Unstalled(**out.head(f"moving again: {said}"), detail=ReasonDetail(reason=said)))
        return out
    asked = [n for n in before.asked if n in letters]
    state.stall = before.model_copy(
        update={
            "letters": letters,
            "escalation_id": ids.stalled_escalation(state.run_id, asked[-1]) if asked else None,
            "requeue_to": {n: to for n, to in before.requeue_to.items() if n in letters},
            "asked": asked,
        }
    )
    return out


def apply_stall_resolution(state: RunState, res: EscalationResolution) -> Outbox:
    """A person's (or the SLA's) answer on a stalled run's item: hand its letter back, or abort the run."""
    out = Outbox(state)
    stall = state.stall
    seq = next(
        (n for n in (stall.letters if stall else []) if ids.stalled_escalation(state.run_id, n) == res.escalation_id),
        None,
    )
    if stall is None or seq is None or state.done:
        return out  # stale: the run moved on (its letter was handed back some other way) or ended
    who = f"the SLA ({res.note})" if res.by_sla else res.resolved_by
    if res.action == "abort":
        state.stall = None
        _withdraw(out, [n for n in stall.asked if n != seq], f"the run was aborted by {who}")
        finish(out, "stopped", f"aborted by {who}: {res.note or stall.reason}")
        return out
    if res.action != "requeue":
        return out  # the queue offers a stalled item nothing else
    requeue_to = stall.requeue_to.get(seq)
    if requeue_to is None:  # nothing can move it on: it ends, saying why, rather than stay stalled for ever
        state.stall = None
        _withdraw(out, [n for n in stall.asked if n != seq], f"dead letter {seq} cannot be handed back")
        finish(out, "failed", f"{stall.reason}; {who} asked to requeue it, but it cannot be handed back")
        return out
    out.event(
        Resumed(
            **{**out.head(f"human {res.resolved_by}: requeue dead letter {seq}"), "status": "stalled"},
            detail=ResumedDetail(action="requeue", escalation_id=res.escalation_id),
        )
    )
    msg_id = ids.stall_requeue(seq, res.escalation_id, res.resolved_by, res.resolved_at.isoformat())
    out.add(requeue_to, requeue_command(seq), msg_id)  # as `loopwarden dlq requeue N` sends it
    return out


# --- a service with no live replica ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Need:
    """A service a run waits on; ``durable``: the one its work waits in (an executor's tool)."""

    service: str
    label: str
    durable: str | None = None


def needs(state: RunState) -> list[Need]:
    """What the run waits on now, from its state: the queue while a person decides; the executors hosting its
    dispatched calls and the validator their results go through; the judge on a candidate; else its next model
    turn's budget (the governor). The planner itself is what asks."""
    if state.done:
        return []
    if state.status == "awaiting_human":
        return [Need("escalation", "escalation")]
    it = state.iteration
    calls = [c for c in it.pending if c.status == "dispatched" and c.tool != DELEGATE]  # a child is a run
    if calls:
        tools = dict.fromkeys(c.tool for c in calls)
        executors = [Need("executor", f"executor hosting {t}", S.executor_durable(t)) for t in tools]
        return [*executors, Need("validator", "validator")]
    if it.pending:
        return []  # a sub-agent's run answers it
    if it.judge_requested and it.verdict is None:
        return [Need("judge", "judge")]
    return [Need("governor", "governor")]


def first_missing(wanted: list[Need], fleet: Fleet) -> Need | None:
    """The first service the run waits on that no live replica serves."""
    return next((n for n in wanted if not fleet.serves(n.service, n.durable)), None)


def missing_replica(state: RunState, need: Need, *, now: datetime, after_s: float) -> Outbox | None:
    """The run has not moved for ``after_s`` and waits on ``need``, which has no live replica: stalled so (None:
    it moved since, ended, or is known to wait on it)."""
    before = state.stall
    if state.done or now - state.updated_at < timedelta(seconds=after_s):
        return None
    if before is not None and before.missing == need.label:
        return None
    out = Outbox(state)
    reason = f"no live {need.label} replica" if need.durable is None else f"no live replica of the {need.label}"
    if before is not None and before.letters:
        state.stall = before.model_copy(update={"missing": need.label})
    else:
        state.stall = Stall(reason=reason, missing=need.label, since=now)
    _stalled_event(out, f"stalled: {reason}", StalledDetail(reason=reason, service=need.service))
    return out


# --- any other message applied to the run -----------------------------------------------------------------------
def moved(state: RunState, out: Outbox, before: Stall | None) -> None:
    """After a message other than the stall rules' was applied (``transaction.apply_message``): the run moved.
    A stall on a missing replica ends; a run that ended is stalled no more (its item withdrawn)."""
    if before is None or state.stall is not before:
        return  # not stalled, or a stall rule's own change
    if state.done:
        state.stall = None
        _withdraw(out, before.asked, f"the run ended ({state.status})")
        return
    if before.missing is None:
        return  # it waits on its letters: handed back and handled, they end it
    if before.letters:
        state.stall = before.model_copy(update={"missing": None})
        return
    state.stall = None
    said = f"moving again: the work it waited on moved ({before.missing} is back)"
    out.event(Unstalled(**out.head(said), detail=ReasonDetail(reason=said)))


# --- a submit refused before it started ---------------------------------------------------------------------------
def submitted_task(letter: DeadLetter) -> str:
    """The task a refused submit's letter names (what its record shows), or a note that it could not be read."""
    try:
        body: Any = json.loads(letter.body)
    except (ValueError, RecursionError):
        body = None
    task = body.get("task") if isinstance(body, dict) else None
    return _cut(task, 2000) if isinstance(task, str) and task else "(the submit could not be read)"


def refused(run_id: str, tenant: str, task: str, reason: str, config: RunConfig) -> Outbox:
    """The record of a submit that was not started (final ``refused``, with the reason) and its final event, so
    its submitter's wait ends with the reason instead of a timeout."""
    state = RunState(run_id=run_id, task=task, config=config, iteration=Iteration(n=0), tenant=tenant)
    state.refusal = Refusal(reason=_cut(reason, 2000))  # not a quota: the client's ``Refused`` names the reason
    out = Outbox(state)
    finish(out, "refused", _cut(reason, 2000))
    state.remember(ids.REFUSED, out.items)
    return out
