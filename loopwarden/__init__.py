"""Loopwarden's public API: the one import path, the same in the repository and in the installed wheel.

    from loopwarden import Client, load_scenario, tool, ToolFailure

Everything a user needs to submit and wait for runs, read and watch their events, work the escalation
queue and write a tool is here; the modules behind it (``shared``, ``services``, ``loopwarden.*``) are
internal and may change. docs/embedding.md shows it in use.

The names are loaded on first use (PEP 562), so ``import loopwarden`` and the ``loopwarden`` command stay
quick; ``__all__`` lists them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from loopwarden.client import (
        Client,
        Event,
        NotAccepted,
        NotAllowed,
        NumberedLetter,
        PermissionDenied,
        QuotaExceeded,
        Refused,
        Requeued,
        RunResult,
        UnknownAgent,
        Unreachable,
        Watch,
        new_run_id,
    )
    from shared.agents import AgentError, load_agent
    from shared.messages import (
        FINAL_STATUSES,
        Agent,
        AgentRecord,
        ChatMessage,
        Criterion,
        Escalation,
        EscalationAction,
        EscalationReply,
        FailureType,
        RepairRule,
        RetryPolicy,
        Rubric,
        RunLimits,
        RunSnapshot,
        RunStatus,
        RunSubmit,
        ToolContract,
        Usage,
    )
    from shared.scenario import Scenario, ScenarioError, load_scenario, parse_scenario
    from shared.settings import Settings
    from shared.tools import ToolContext, ToolFailure, ToolState, tool

__all__ = [  # noqa: RUF022 - grouped by what a user does, not sorted
    # connecting, runs and their events
    "Client",
    "Settings",
    "Unreachable",
    "RunSubmit",
    "RunLimits",
    "RunSnapshot",
    "RunStatus",
    "FINAL_STATUSES",
    "Usage",
    "ChatMessage",
    "Event",
    "Watch",
    "new_run_id",
    # a submit refused at the door (a quota, or one the planner does not start), or not answered
    "Refused",
    "QuotaExceeded",
    "NotAccepted",
    # agents: defined in Python or a file, registered, run by name
    "Agent",
    "AgentRecord",
    "AgentError",
    "load_agent",
    "RunResult",
    "UnknownAgent",
    "NotAllowed",
    "PermissionDenied",
    # scenarios (scripted runs with their expectations) and rubrics
    "Scenario",
    "ScenarioError",
    "load_scenario",
    "parse_scenario",
    "Rubric",
    "Criterion",
    # the human queue and dead letters
    "Escalation",
    "EscalationAction",
    "EscalationReply",
    "NumberedLetter",
    "Requeued",
    # writing a tool
    "tool",
    "ToolFailure",
    "ToolContext",
    "ToolState",
    "FailureType",
    "RetryPolicy",
    "RepairRule",
    "ToolContract",
]


def _client() -> Any:
    from loopwarden import client

    return client


def _tools() -> Any:
    # ``shared`` imports are rewritten to ``loopwarden.shared`` in the wheel
    from shared import tools

    return tools


def _messages() -> Any:
    from shared import messages

    return messages


def _agents() -> Any:
    from shared import agents

    return agents


def _scenario() -> Any:
    from shared import scenario

    return scenario


def _settings() -> Any:
    from shared import settings

    return settings


_HOME = {
    **dict.fromkeys(
        (
            "Client",
            "Event",
            "NotAccepted",
            "NotAllowed",
            "NumberedLetter",
            "PermissionDenied",
            "QuotaExceeded",
            "Refused",
            "Requeued",
            "RunResult",
            "UnknownAgent",
            "Unreachable",
            "Watch",
            "new_run_id",
        ),
        _client,
    ),
    **dict.fromkeys(("AgentError", "load_agent"), _agents),
    **dict.fromkeys(("ToolState", "ToolContext", "ToolFailure", "tool"), _tools),
    **dict.fromkeys(("Scenario", "ScenarioError", "load_scenario", "parse_scenario"), _scenario),
    "Settings": _settings,
}


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'loopwarden' has no attribute {name!r}")
    value = getattr(_HOME.get(name, _messages)(), name)
    globals()[name] = value  # loaded once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
