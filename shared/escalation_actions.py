"""The human queue's vocabulary in one table: what kinds of item there are, which actions each
allows, what an action must carry, and what the SLA does when nobody decides.

The escalation service (``services/escalation/queue.py``: allowed actions, a resolution's
preconditions, SLAs), the console (its forms and the action it accepts) and the CLI
(``loopwarden escalations resolve --action``) read these tables; the planner applies an action to
the run in ``services/planner/escalations.py`` with a ``match`` closed by ``assert_never``. A new
action is a word in ``EscalationAction``, a row in ``ACTIONS``, its kinds in ``KINDS`` and its
effect in that ``match`` (mypy points at it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, get_args

EscalationKind = Literal[
    "fatal", "unknown_outcome", "schema_cap", "ask_human", "not_judged", "loop", "approval", "spawn", "stalled"
]  # "spawn": the sub-agent spawn gate (services/planner/delegation.py); "stalled": a message of the run was
# dead-lettered (services/planner/stalls.py)

EscalationAction = Literal[
    "resume",  # continue with the note as the human's word on the failure
    "abort",  # end the run (stopped)
    "provide_result",  # the tool's result by hand, validated against its output contract
    "accept",  # not_judged: the candidate passes (same as approve)
    "approve",  # not_judged / approval / spawn: yes
    "reject",  # not_judged: revise with the note; approval / spawn: no
    "final_answer",  # end the run completed with this answer (``result`` is the text)
    "retry",  # the model tries again with the note as its instruction
    "requeue",  # stalled: hand the run's dead letter back to the service that gave up on it
]
SlaAction = Literal["abort", "deny", "accept_if_judged", "fall_back"]
Needs = Literal["nothing", "json", "text", "note"]
"""What a resolution must carry: ``json`` a result (checked against the tool's output contract),
``text`` a result that is non-empty text, ``note`` a non-empty note."""


@dataclass(frozen=True)
class ActionSpec:
    meaning: str  # one line, for help texts and the docs
    needs: Needs = "nothing"
    only: str | None = None  # why the action is refused on a kind that does not list it (None: the generic reason)


@dataclass(frozen=True)
class SlaRule:
    after_s: float
    action: SlaAction


HOUR = 3600.0


@dataclass(frozen=True)
class KindSpec:
    actions: tuple[EscalationAction, ...]  # what a person may do with an item of this kind, in the order shown
    sla: SlaRule  # the default (``LW_ESCALATION_SLAS`` overrides it)
    about_a_call: bool = False  # raised about one tool call (a tool's failure, its contract, its boundary)


ACTIONS: dict[EscalationAction, ActionSpec] = {
    "resume": ActionSpec("continue with the note as the human's word on the failure"),
    "abort": ActionSpec("end the run (stopped)"),
    "provide_result": ActionSpec("the tool's result by hand, checked against its output contract", needs="json"),
    "accept": ActionSpec(
        "the candidate passes (same as approve)", only="'accept' applies to a candidate the judge could not score"
    ),
    "approve": ActionSpec("yes: the candidate passes, the gate opens"),
    "reject": ActionSpec("no: revise with the note, or the gate stays shut"),
    "final_answer": ActionSpec("end the run completed with this answer", needs="text"),
    "retry": ActionSpec("the model tries again with the note as its instruction", needs="note"),
    "requeue": ActionSpec(
        "hand the run's dead letter back to the service that gave up on it (as `loopwarden dlq requeue N`)",
        only="'requeue' applies to a run stalled on a dead letter",
    ),
}

_CALL: tuple[EscalationAction, ...] = ("provide_result", "retry", "resume", "final_answer", "abort")
_GATE: tuple[EscalationAction, ...] = ("approve", "reject", "abort")
KINDS: dict[EscalationKind, KindSpec] = {
    "fatal": KindSpec(_CALL, SlaRule(HOUR, "abort"), about_a_call=True),
    "unknown_outcome": KindSpec(_CALL, SlaRule(HOUR, "abort"), about_a_call=True),
    "schema_cap": KindSpec(_CALL, SlaRule(HOUR, "abort"), about_a_call=True),
    "ask_human": KindSpec(_CALL, SlaRule(HOUR, "fall_back"), about_a_call=True),
    "not_judged": KindSpec(("approve", "accept", "reject", "final_answer", "abort"), SlaRule(HOUR, "accept_if_judged")),
    "loop": KindSpec(("retry", "resume", "final_answer", "abort"), SlaRule(HOUR, "abort")),
    "approval": KindSpec(_GATE, SlaRule(HOUR, "deny")),
    "spawn": KindSpec(_GATE, SlaRule(HOUR, "deny")),
    # a day, not an hour: an outage that dead-lettered many runs' messages is requeued once it is over
    "stalled": KindSpec(("requeue", "abort"), SlaRule(24 * HOUR, "abort")),
}
if set(ACTIONS) != set(get_args(EscalationAction)) or set(KINDS) != set(get_args(EscalationKind)):
    raise RuntimeError("shared/escalation_actions.py: every EscalationAction and EscalationKind needs its row")


def allowed_actions(kind: EscalationKind) -> list[EscalationAction]:
    """What a person may do with an item of this kind (the console shows exactly these)."""
    return list(KINDS[kind].actions)


def parse_action(value: str) -> EscalationAction:
    """An action's name as a surface received it (a form field, a flag); a clear error otherwise."""
    for action in ACTIONS:
        if action == value:
            return action
    raise ValueError(f"unknown action {value!r}: use one of {', '.join(ACTIONS)}")


def carries_result(action: EscalationAction) -> bool:
    """The action carries the tool's result, checked against the tool's output contract (its ``needs`` is
    ``json``): the escalation service checks it, and a surface offers it only where a contract exists."""
    return ACTIONS[action].needs == "json"


def offered(actions: Iterable[EscalationAction], has_contract: bool) -> list[EscalationAction]:
    """The actions a surface offers on an item: without an output contract for its tool, a result could only
    be refused, so the actions that carry one are left out."""
    return [a for a in actions if has_contract or not carries_result(a)]


def withheld(actions: Iterable[EscalationAction], has_contract: bool) -> list[EscalationAction]:
    """The actions ``offered`` leaves out (to say why, next to what is offered)."""
    return [a for a in actions if not has_contract and carries_result(a)]


def missing(action: EscalationAction, note: str, result: Any) -> str | None:
    """What a resolution lacks for its action (a sentence), or None."""
    needs = ACTIONS[action].needs
    if needs == "json" and result is None:
        return f"{action} needs the tool's result"
    if needs == "text" and not (isinstance(result, str) and result.strip()):
        return f"{action} needs the answer as text"
    if needs == "note" and not note.strip():
        return f"{action} needs an instruction for the model (the note)"
    return None
