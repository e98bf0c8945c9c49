"""What a run accepts before anything is built from it (pure): who submitted it, what it may set.

A client submits on ``cmd.run.submit.<tenant>``; the server lets each client user publish only its own
tenant's subject, so the tenant is the subject's token, never the body's word. An operator replays a recorded
run on ``cmd.run.submit.<tenant>.replay`` (the replayed run's tenant pays): its scenario is accepted whatever
``LW_ALLOW_SCRIPTED`` says, since no client user may publish there. Only the planner
starts a child run (``cmd.run.spawn``, which no client may publish): the ``parent_*`` fields and a depth
are accepted there only. Per-run limits are capped by settings, and a scenario (a scripted run) is
accepted only where scripted runs are allowed, and only up to its size limit.

``admit`` returns the submit as the run will be started (its tenant filled in), or why it is refused:
one line naming the field and what it broke, for the dead letter.

A submit naming a registered agent (``RunSubmit.agent``) is resolved by ``resolve_agent``: the submit's
task and scenario stand, and everything else a run is configured by is the definition's (instructions,
model, tools, rubric, limits, answer mode); ``with_agent`` puts its instructions, model, name and version
into the run's config. Both are pure: the handler reads the definition from ``lw_agents``.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

from shared import subjects as S
from shared.messages import NAME_PATTERN, AgentRecord, RunSubmit
from shared.settings import Settings

if TYPE_CHECKING:
    from services.planner.state import RunConfig

_TENANT = re.compile(NAME_PATTERN)


class Refused(Exception):
    """A submit the planner does not start (the reason is one line, for the dead letter)."""


def submitted_on(subject: str) -> tuple[str, bool]:
    """The tenant a submit subject names, and whether it is an operator's replay: ``lw.v1.cmd.run.submit.<tenant>``
    (stored as ``lw.v1.cmd.run.submit.<partition>.<tenant>``, the door's partition), or
    ``lw.v1.cmd.run.submit.<tenant>.replay`` (``S.run_replay``, which no client user may publish)."""
    prefix = S.RUN_SUBMIT_PREFIX + "."
    tenant, _, tail = (subject[len(prefix) :] if subject.startswith(prefix) else "").partition(".")
    if tail and tenant.isdigit() and int(tenant) < S.SUBMIT_PARTITIONS and "." not in tail:
        # as LW_SUBMIT stores it: under the tenant's partition of the door (``S.SUBMIT_TRANSFORM``)
        tenant, tail = tail, ""
    if (tail and tail != S.REPLAY) or not _TENANT.match(tenant):
        raise Refused(f"not a submit subject of a tenant: {subject[:200]}")
    return tenant, tail == S.REPLAY


def tenant_of(subject: str) -> str:
    """The tenant a submit subject names (``lw.v1.cmd.run.submit.<tenant>[.replay]``)."""
    return submitted_on(subject)[0]


def is_replay(subject: str) -> bool:
    """Whether a submit came on the operators' replay subject."""
    try:
        return submitted_on(subject)[1]
    except Refused:
        return False


def admit(submit: RunSubmit, subject: str, settings: Settings) -> RunSubmit:
    """The submit as the run will start, or ``Refused``: ``subject`` is where it arrived."""
    if subject == S.RUN_SPAWN:  # the planner's own: a child run, its limits derived from its parent's
        check_scenario(submit, settings)
        return submit
    tenant, replay = submitted_on(subject)
    if replay and submit.scenario is None:
        raise Refused("a replay carries the recorded run's scenario (loopwarden replay, the console's Replay)")
    if submit.tenant is not None and submit.tenant != tenant:
        raise Refused(f"tenant {submit.tenant!r} is not the submitter's: this subject submits for {tenant!r}")
    spawned = {
        "parent_run_id": submit.parent_run_id,
        "parent_call_id": submit.parent_call_id,
        "parent_iteration": submit.parent_iteration or None,
        "depth": submit.depth or None,
    }
    named = [field for field, value in spawned.items() if value is not None]
    if named:
        raise Refused(f"{', '.join(named)}: only the planner starts a sub-agent run (cmd.run.spawn)")
    check_limits(submit, settings)
    check_scenario(submit, settings, replay=replay)
    return submit.model_copy(update={"tenant": tenant})


def check_limits(submit: RunSubmit, settings: Settings) -> None:
    """Every per-run limit the submit sets is at most its cap (``LW_RUN_LIMIT_CAPS``)."""
    for field, cap in settings.run_limit_caps.items():
        value = getattr(submit.limits, field)
        if value is not None and value > cap:
            raise Refused(f"limits.{field} {value:g} is over the cap {cap:g} (LW_RUN_LIMIT_CAPS)")


def check_scenario(submit: RunSubmit, settings: Settings, *, replay: bool = False) -> None:
    """A scenario only where scripted runs are allowed or on an operator's replay (``replay``), and no larger
    than ``LW_SCENARIO_MAX_BYTES``."""
    if submit.scenario is None:
        return
    if not settings.allow_scripted and not replay:
        raise Refused("scenario: scripted runs are not allowed here (LW_ALLOW_SCRIPTED=false)")
    size = len(json.dumps(submit.scenario, separators=(",", ":"), ensure_ascii=False).encode())
    if size > settings.scenario_max_bytes:
        raise Refused(f"scenario: {size} bytes is over the limit {settings.scenario_max_bytes} (LW_SCENARIO_MAX_BYTES)")


def resolve_agent(submit: RunSubmit, record: AgentRecord | None, planner_provider: str) -> RunSubmit:
    """The submit of a run of ``submit.agent`` as its definition ``record`` makes it, or ``Refused``: no
    such agent, a tenant the agent is not for, or a live run on a planner whose provider
    (``planner_provider``) is not the one the agent needs. A scripted run (with a scenario) is replayed by
    the scripted provider whatever the agent names. The definition's limits are capped like a submit's."""
    name = submit.agent
    if name is None:
        return submit
    if record is None:
        raise Refused(f"agent {name!r} is not registered (`loopwarden agents list` shows those that are)")
    agent = record.agent
    if agent.tenants is not None and submit.tenant not in agent.tenants:
        raise Refused(f"agent {name!r} is not for tenant {submit.tenant!r} (it is for {', '.join(agent.tenants)})")
    if submit.scenario is None and agent.provider is not None and agent.provider != planner_provider:
        raise Refused(
            f"agent {name!r} needs the {agent.provider} provider; this planner's is {planner_provider} "
            "(LW_PLANNER_PROVIDER)"
        )
    return submit.model_copy(
        update={
            "rubric": agent.rubric,
            "limits": agent.limits,
            "answer_mode": agent.answer_mode,
            "terminal_tools": list(agent.terminal_tools),
            "tools": None if agent.tools is None else list(agent.tools),
            "lessons": agent.lessons,
        }
    )


def with_agent(config: RunConfig, record: AgentRecord | None) -> RunConfig:
    """The run's config with what only the agent sets: its instructions, its model, and which agent and
    version the run is of."""
    if record is None:
        return config
    agent = record.agent
    return config.model_copy(
        update={
            "instructions": agent.instructions,
            "model": agent.model or config.model,
            "agent": agent.name,
            "agent_version": record.version,
        }
    )
