"""What each failure type does, in one table.

A row says who decides the failure, whether the executor retries it (with the contract's backoff),
whether a fallback tool or the cached result may stand in once retries are spent, whether the
tool's boundary (``skip_and_note`` / ``use_cached`` / ``ask_human``) applies, whether the model
corrects it against the contract, whether a human decides at once (and as which escalation kind),
whether a scenario may script it, and what the model is told.

The planner routes a call's failure in this order: ``corrects`` (a correction, a human past the cap),
else ``human`` (waits for that human), else the boundary the failure carries, else the model reads it.

The groupings the rest of the code uses (subject filters, grants, the scenario's ``fail`` words,
``expect.tools``) are derived from the rows; the executor's recovery, the planner's outcome rules
and the escalation service read the rows. A new failure type is a word in ``FailureType`` and its
row (plus ``HumanFailure`` / ``ScriptedFailure`` when it needs a human or may be scripted: mypy
needs those words written out, and the check below says when they disagree with the table).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeGuard, get_args

from shared.escalation_actions import EscalationKind

FailureType = Literal[
    "input_invalid",  # arguments broke the input schema: never executed
    "output_invalid",  # the tool's output broke its output schema
    "transient",  # timeout-like or overload: retried with backoff by the executor
    "timeout",  # the tool exceeded its time limit
    "fatal",  # non-recoverable: escalates at once
    "unknown_outcome",  # a non-idempotent call may or may not have happened
    "loop",  # the model repeats itself
    "budget",  # tokens or cost exhausted
    "judge",  # the judge could not score a candidate
    "tool_error",  # the tool ran and reported an error the model can act on (an MCP isError result)
    "unknown_tool",  # the model called a tool no replica hosts (or not offered to the run): never executed
]
"""Every failure type, in the order of the schemas' enums (wire values: never renamed)."""
HumanFailure = Literal["fatal", "unknown_outcome"]
ScriptedFailure = Literal["transient", "timeout", "fatal"]
Decider = Literal["tool", "planner", "run"]
"""``tool``: a tool call's outcome (executor or validator); ``planner``: a call decided before any
dispatch; ``run``: the run's own (a loop, the budget, the judge), never a call's outcome."""

CANNOT_RETRY = "'{tool}' failed and cannot be retried: {detail}. A human has been notified."


@dataclass(frozen=True)
class FailureRule:
    decided_by: Decider
    retried: bool = False  # the executor retries it with the contract's backoff
    stands_in: bool = False  # retries spent: a fallback tool, or the cached result, may stand in
    boundary: bool = False  # the contract's boundary (skip_and_note, use_cached, ask_human) travels with it
    recoverable: bool = False  # the model can act on it (``ToolOutcome.recoverable``)
    corrects: bool = False  # a contract broke: the model gets errors and schema; a human past the correction cap
    human: EscalationKind | None = None  # a human decides at once, on an item of this kind
    replaceable: bool = False  # a known outcome of the same attempt recorded later replaces it (it wins)
    ran: bool = True  # the tool ran, or may have: False when the call was refused before any tool ran
    validator: bool = False  # the validator decides it (a tool's output against its contract), not the executor
    scriptable: bool = False  # a scenario's ``tools.<name>.fail`` may script it
    tells: str = (
        CANNOT_RETRY  # what the model reads ({tool}, {detail}, {tried}); schema failures: context.schema_feedback
    )


FAILURES: dict[FailureType, FailureRule] = {
    "input_invalid": FailureRule("tool", boundary=True, recoverable=True, corrects=True, ran=False),
    "output_invalid": FailureRule("tool", boundary=True, recoverable=True, corrects=True, validator=True),
    "transient": FailureRule(
        "tool",
        retried=True,
        stands_in=True,
        boundary=True,
        recoverable=True,
        scriptable=True,
        tells="'{tool}' is temporarily unavailable ({detail}){tried}. Try again later, use another tool, "
        "or continue without this information.",
    ),
    "timeout": FailureRule(
        "tool",
        retried=True,
        stands_in=True,
        boundary=True,
        recoverable=True,
        scriptable=True,
        tells="'{tool}' did not respond in time ({detail}){tried}. It may be overloaded; try a narrower request, "
        "another tool, or continue without it.",
    ),
    "fatal": FailureRule("tool", boundary=True, human="fatal", scriptable=True),
    "unknown_outcome": FailureRule(
        "tool",
        boundary=True,
        human="unknown_outcome",
        replaceable=True,  # the replica that ran it may record its result after another declared it unknown
        tells="'{tool}' may or may not have completed: the process running it stopped before recording the "
        "result, and it is not safe to repeat. A human is checking; do not call it again for this request.",
    ),
    "loop": FailureRule("run"),
    "budget": FailureRule("run"),
    "judge": FailureRule("run"),
    # the tool's own answer (an MCP isError result): the model reads it as is and can correct it
    "tool_error": FailureRule("tool", recoverable=True, tells="{detail}"),
    "unknown_tool": FailureRule("planner", recoverable=True, corrects=True, ran=False),
}


def _where(flag: str) -> tuple[FailureType, ...]:
    # the Literal's order: subject filters and grants keep it between runs
    return tuple(t for t in get_args(FailureType) if getattr(FAILURES[t], flag) is True)


def _decided_by(who: Decider) -> tuple[FailureType, ...]:
    return tuple(t for t in get_args(FailureType) if FAILURES[t].decided_by == who)


# --- the groupings, derived (tuples, not sets: their order is the order of subject filters and grants) ---
SCHEMA_FAILURES: tuple[FailureType, ...] = tuple(t for t in _decided_by("tool") if FAILURES[t].corrects)
"""A contract broke: the model gets the errors and the schema and corrects (a human past the cap)."""
RETRIED_FAILURES: tuple[FailureType, ...] = _where("retried")
"""Retried with backoff by the executor (then fallback, cache or boundary)."""
HUMAN_FAILURES: tuple[HumanFailure, ...] = get_args(HumanFailure)
"""Escalated at once: the escalation service raises them from its failure subscription."""
TOOL_FAILURES: tuple[FailureType, ...] = _decided_by("tool")
"""Every way a tool call can fail; the planner hears each one as the call's outcome."""
PLANNER_FAILURES: tuple[FailureType, ...] = _decided_by("planner")
"""Decided by the planner before any dispatch (published on ``failure.<type>.<tool>`` for the record,
never consumed back): the model gets the tools it may call and corrects, a human past the correction cap."""
CALL_FAILURES: tuple[FailureType, ...] = (*TOOL_FAILURES, *PLANNER_FAILURES)
"""Every failure a run's tool call can end with (``expect.tools`` counts them by these names)."""
RUN_FAILURES: tuple[FailureType, ...] = _decided_by("run")
"""The run's own failures (a loop, the budget, the judge), published by the planner, never a call's outcome."""
EXECUTOR_FAILURES: tuple[FailureType, ...] = tuple(t for t in TOOL_FAILURES if not FAILURES[t].validator)
"""The tool failures the executor decides and publishes (the validator decides the rest)."""
NEVER_RAN: tuple[FailureType, ...] = tuple(t for t in CALL_FAILURES if not FAILURES[t].ran)
"""A call refused before any tool ran: there is no output to record or replay."""
SCRIPTED_FAILURES: tuple[ScriptedFailure, ...] = get_args(ScriptedFailure)
"""What a scenario's ``tools.<name>.fail`` may say."""

if set(FAILURES) != set(get_args(FailureType)):
    raise RuntimeError("shared/failures.py: every FailureType needs its row in FAILURES")
if set(HUMAN_FAILURES) != {t for t, r in FAILURES.items() if r.human} or not set(HUMAN_FAILURES) <= set(TOOL_FAILURES):
    raise RuntimeError("shared/failures.py: HumanFailure must name exactly the tool failures whose row has a human")
if set(SCRIPTED_FAILURES) != {t for t, r in FAILURES.items() if r.scriptable}:
    raise RuntimeError("shared/failures.py: ScriptedFailure must name exactly the rows that are scriptable")


def is_failure_type(value: str) -> TypeGuard[FailureType]:
    """``value`` names a failure type (a subject token, a stored word)."""
    return value in FAILURES


def parse_failure_type(value: str) -> FailureType:
    """A failure type as a surface received it (a query field, a flag); a clear error otherwise."""
    if is_failure_type(value):
        return value
    raise ValueError(f"unknown failure type {value!r}: use one of {', '.join(get_args(FailureType))}")


def replaceable(failure: FailureType | None) -> bool:
    """A known outcome of the same attempt, recorded later, replaces this one: the executor's ledger lets it
    win, the planner applies it under its own message id (``planner/ids.outcome``) and takes it over the
    escalation (``planner/outcomes.supersedes_unknown``)."""
    return failure is not None and FAILURES[failure].replaceable


def needs_human(failure: FailureType) -> TypeGuard[HumanFailure]:
    return FAILURES[failure].human is not None


def human_kind(failure: FailureType | None) -> EscalationKind:
    """The escalation kind a failure raised to a human is filed under (``fatal`` when it names none)."""
    return (FAILURES[failure].human if failure is not None else None) or "fatal"


def tells(tool: str, failure: FailureType, detail: str, attempts: int) -> str:
    """The failure as the model reads it: what happened and what it can do next."""
    tried = f" after {attempts} attempt(s)" if attempts > 1 else ""
    return FAILURES[failure].tells.format(tool=tool, detail=detail, tried=tried)
