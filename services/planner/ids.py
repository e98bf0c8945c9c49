"""Every id the planner derives from the message that caused it, in one place.

Exactly-once rests on these: a transition that runs again (a redelivery) must publish under the
same message ids, so JetStream drops the copies, and must find itself applied under the same key.
So every id is a pure function of the causing message (run, iteration, call, candidate, escalation)
or of a counter kept in the run state, never of time or chance. Three kinds:

* message ids (``Nats-Msg-Id``) of what the planner publishes, each starting with the run id;
* applied keys: the message a transition answers, remembered in ``RunState.applied`` with its outbox;
* the ids the planner names things by (candidates, escalations, tool attempts).
"""

from __future__ import annotations

from shared import subjects as S
from shared.messages import escalation_id_for_call

# --- message ids of what the planner publishes -------------------------------------------------------


def event(run_id: str, kind: str, iteration: int, n: int) -> str:
    """The run's ``n``-th event (a counter in the run state: unique however long the run)."""
    return f"{run_id}.evt.{kind}.{iteration}.{n}"


def advance(run_id: str, iteration: int) -> str:
    return f"{run_id}.adv.{iteration}"


def tool_call(run_id: str, iteration: int, call_id: str) -> str:
    """Scoped to the iteration: a model may reuse a call id in a later turn."""
    return f"{run_id}.call.{iteration}.{call_id}"


def unknown_tool(run_id: str, iteration: int, call_id: str) -> str:
    """The ``unknown_tool`` failure of a call the planner never dispatched."""
    return f"{run_id}.unknown.{iteration}.{call_id}"


def guard(run_id: str, iteration: int) -> str:
    """The budget guard tripped before the iteration's model call."""
    return f"{run_id}.guard.{iteration}"


def cost_guard(run_id: str, n: int) -> str:
    return f"{run_id}.guard.cost.{n}"


def judge_request(run_id: str, candidate_id: str) -> str:
    return f"{run_id}.judge.{candidate_id}"


def not_judged(run_id: str, candidate_id: str) -> str:
    return f"{run_id}.notjudged.{candidate_id}"


def loop(run_id: str, kind: str, iteration: int, call_id: str) -> str:
    """A loop finding on a call (scoped to the iteration, like the call)."""
    return f"{run_id}.loop.{kind}.{iteration}.{call_id}"


def escalation_raise(run_id: str, escalation_id: str) -> str:
    return f"{run_id}.esc.{escalation_id}"


def escalation_withdraw(run_id: str, escalation_id: str) -> str:
    return f"{run_id}.esc.{escalation_id}.withdrawn"


def answer_to_parent(run_id: str, parent_call_id: str | None) -> str:
    """A sub-agent's outcome, published as the parent's delegate call's outcome."""
    return f"{run_id}.answer.{parent_call_id}"


def child_submit(child_run_id: str) -> str:
    return f"{child_run_id}.submit"


def refused_scenario(run_id: str) -> str:
    """The dead letter of a submit whose scenario was refused."""
    return f"dlq-planner-scenario-{run_id}"


def refused_submit(run_id: str, body_digest: str) -> str:
    """The dead letter of a submit refused at admission (one per distinct body: a redelivery is the same)."""
    return f"dlq-planner-submit-{run_id}-{body_digest[:16]}"


# --- applied keys: the message a transition answers ---------------------------------------------------

SUBMIT = "submit"
ADMITTED = "admitted"  # a queued run's start, once it is admitted to the fleet


def ticket(run_id: str) -> str:
    """A waiting run's ticket in ``LW_FLOW`` (a redelivered submit publishes the same one)."""
    return f"{run_id}.ticket"


def refused(run_id: str) -> str:
    """The ``run.refused`` event of a submit refused at the door."""
    return f"{run_id}.evt.refused"


def advanced(iteration: int) -> str:
    return f"advance.{iteration}"


def outcome(iteration: int, call_id: str, unknown: bool = False) -> str:
    """A call's outcome as applied; an ``unknown_outcome`` has its own, so the known result that replaces it
    (``outcomes.supersedes_unknown``) is applied too, not taken for a duplicate."""
    return f"outcome.{iteration}.{call_id}" + (".unknown" if unknown else "")


def verdict(candidate_id: str) -> str:
    return f"verdict.{candidate_id}"


def handled_by(run_id: str, msg_id: str) -> tuple[str, ...]:
    """The applied ids that prove the planner's command ``msg_id`` of ``run_id`` was handled for good: an advance
    by its own, a tool call by its outcome (known or unknown), a judge request by its verdict; () for any other."""
    kind, _, rest = msg_id.removeprefix(f"{run_id}.").partition(".")
    if not msg_id.startswith(f"{run_id}.") or not rest:
        return ()
    if kind == "adv" and rest.isdigit():
        return (advanced(int(rest)),)
    if kind == "call":
        n, _, call_id = rest.partition(".")
        return (outcome(int(n), call_id), outcome(int(n), call_id, unknown=True)) if n.isdigit() and call_id else ()
    if kind == "judge":
        return (verdict(rest),)
    return ()


def resolution(escalation_id: str) -> str:
    return f"resolution.{escalation_id}"


def letter(seq: int) -> str:
    """A dead letter of the run (its LW_DLQ number): the run is stalled on it."""
    return f"letter.{seq}"


def letter_handled(seq: int) -> str:
    """The letter was handed back and handled."""
    return f"handled.{seq}"


def missing_replica(events_published: int) -> str:
    """The planner's sweep found the run waiting on a service with no live replica (once per run state seen)."""
    return f"missing.{events_published}"


REFUSED = "refused"


def stall_requeue(letter: int, escalation_id: str, resolved_by: str, resolved_at: str) -> str:
    """The requeue a person's resolution of a stalled run's item sends: the same for a redelivered resolution,
    and not one a client could send first on LW_SUBMIT (where message ids are de-duplicated) to make it a silent
    duplicate (as ``dead_letters.requeue_msg_id``'s random tail keeps the CLI's; security review 4, N4)."""
    import hashlib

    digest = hashlib.sha256(f"{escalation_id}|{resolved_by}|{resolved_at}".encode()).hexdigest()[:32]
    return f"requeue-{letter}-{digest}"


# --- ids the planner names things by -------------------------------------------------------------------


def candidate(run_id: str, iteration: int) -> str:
    """The iteration's answer (a final text or a terminal tool's payload)."""
    return f"{run_id}-c{iteration}"


def wrap_up_candidate(run_id: str, iteration: int) -> str:
    return f"{run_id}-wrap{iteration}"


def human_candidate(run_id: str, iteration: int) -> str:
    """The answer a human gave when resolving an escalation."""
    return f"{run_id}-human{iteration}"


def attempt(run_id: str, iteration: int, call_id: str) -> str:
    """A tool call's first attempt (the executor derives its retries and fallbacks from it)."""
    return S.kv_key(run_id, f"i{iteration}", call_id)


def call_escalation(run_id: str, iteration: int, call_id: str) -> str:
    """A tool failure's escalation (the escalation service derives the same id from the outcome)."""
    return escalation_id_for_call(run_id, iteration, call_id)


def schema_cap_escalation(run_id: str, iteration: int, call_id: str) -> str:
    return call_escalation(run_id, iteration, call_id) + "-schema"


def not_judged_escalation(run_id: str, candidate_id: str) -> str:
    return S.kv_key(f"esc-{run_id}-{candidate_id}")


def loop_escalation(run_id: str, iteration: int) -> str:
    return S.kv_key(f"esc-{run_id}-loop-{iteration}")


def spawn_escalation(run_id: str, iteration: int, call_id: str) -> str:
    return S.kv_key(f"esc-{run_id}-spawn-{iteration}-{call_id}")


def stalled_escalation(run_id: str, letter: int) -> str:
    """A stalled run's queue item, about its dead letter ``letter``."""
    return S.kv_key(f"esc-{run_id}-stalled-{letter}")
