"""What a submit brings besides its task, read or stored before the run starts: the scenario of a
scripted run (bound create-only in ``lw_scenarios``), the lessons of earlier attempts at the task
(``lw_lessons``), and the dead letter of a submit the planner does not start."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable

from nats.js.errors import KeyNotFoundError
from pydantic import Field

from services.planner import ids
from services.planner.state import RunState
from shared import subjects as S
from shared.bus import Bus
from shared.canonical import digest_of
from shared.messages import DeadLetter, RunSubmit, Wire
from shared.scenario import Scenario, ScenarioError, keep_bound, parse_scenario

log = logging.getLogger("loopwarden.planner")


class Lessons(Wire):
    reasons: list[str] = Field(default_factory=list)


def lessons_key(task: str, tenant: str | None, agent: str | None) -> str:
    """Lessons are a tenant's own, per agent: a judge's reasons quote the answers it judged, and they go into
    the next run's prompt, so no tenant reads another's or writes into another's (``<tenant>.<agent>.task-…``)."""
    digest = "task-" + hashlib.sha256(task.strip().lower().encode()).hexdigest()[:24]
    return S.kv_key(tenant or S.DEFAULT_TENANT, agent or "-", digest)


async def lessons(bus: Bus, submit: RunSubmit) -> list[str]:
    """What judges rejected this tenant's earlier answers to this task (of this agent) for, when the submit
    asks for lessons."""
    return await lessons_for(bus, submit.task, submit.tenant, submit.agent, submit.lessons)


async def lessons_for(bus: Bus, task: str, tenant: str | None, agent: str | None, wanted: bool) -> list[str]:
    """What judges rejected ``tenant``'s earlier answers to ``task`` (of ``agent``) for, when the run asks for
    lessons (``wanted``): read as the run starts."""
    if not wanted:
        return []
    stored, _ = await bus.kv_get(S.KV_LESSONS, lessons_key(task, tenant, agent), Lessons)
    return stored.reasons if stored else []


async def record_lessons(bus: Bus, state: RunState) -> None:
    """Keep a finished run's judge reasons for the tenant's later runs of the task: only a live judge's
    (``Verdict.judge_provider``: a scripted run's verdicts are what its submitter wrote)."""
    if not state.judge_failures:
        return

    def merge(stored: Lessons | None) -> tuple[Lessons, None]:
        known = stored.reasons if stored else []
        return Lessons(reasons=list(dict.fromkeys([*known, *state.judge_failures]))[-10:]), None

    await bus.update(S.KV_LESSONS, lessons_key(state.task, state.tenant, state.agent), Lessons, merge)


def scenario_error(submit: RunSubmit) -> str | None:
    """What is wrong with the submitted scenario itself (None: it matches its digest and parses): checked at the
    door, before the run is accepted; it is bound when the run starts (``bind_scenario``)."""
    if submit.scenario_digest != digest_of(submit.scenario):
        return "the submitted scenario does not match its scenario_digest"
    try:
        parse_scenario(submit.scenario, f"scenario of {submit.run_id}")
    except ScenarioError as err:
        return str(err)
    return None


async def bind_scenario(bus: Bus, run_id: str, data: dict[str, object], replay: bool = False) -> str | None:
    """Bind a run's scenario (checked at the door) as it starts, create-only (``replay``: it came on an operator's
    replay subject: ``Scenario.replay``); what is wrong (None: bound): another scenario bound under its id."""
    try:
        scenario = parse_scenario(data, f"scenario of {run_id}")
    except ScenarioError as err:
        return str(err)
    scenario = scenario.model_copy(update={"replay": replay})  # the subject says, never the scenario
    stored, _, created = await bus.create_or_get(S.KV_SCENARIOS, run_id, scenario)
    if created or _scenario_digest(stored) == _scenario_digest(scenario):
        keep_bound(bus, run_id, stored)  # the run's first turn here reads nothing
        return None
    return f"another scenario is already bound to run {run_id}"


async def scenario_problem(bus: Bus, submit: RunSubmit, started: bool = False, replay: bool = False) -> str | None:
    """Store the submitted scenario for the run, create-only: the planner is its only writer, so a
    scripted run replays what was submitted with it, and nothing changes it afterwards. What is wrong
    with it (None: bound): a scenario that does not match its digest, does not parse, or differs from
    one already bound, or one for a run already ``started`` without a scenario (a live run is never
    made scripted). ``replay``: it came on an operator's replay subject, and is bound so (``Scenario.replay``:
    replayed by the scripted providers even where scripted runs are off)."""
    if submit.scenario_digest != digest_of(submit.scenario):
        return "the submitted scenario does not match its scenario_digest"
    try:
        scenario = parse_scenario(submit.scenario, f"scenario of {submit.run_id}")
    except ScenarioError as err:
        return str(err)
    scenario = scenario.model_copy(update={"replay": replay})  # the subject says, never the scenario
    if started:  # a scripted run's scenario was bound before its state was stored
        stored, _ = await bus.kv_get(S.KV_SCENARIOS, submit.run_id, Scenario)
    else:
        stored, _, _ = await bus.create_or_get(S.KV_SCENARIOS, submit.run_id, scenario)
    if stored is None:
        return f"run {submit.run_id} was started without a scenario"
    if _scenario_digest(stored) != _scenario_digest(scenario):  # bound before: the same one only
        return f"another scenario is already bound to run {submit.run_id}"
    return None


def _scenario_digest(scenario: Scenario) -> str:
    return digest_of(scenario.model_dump(mode="json", by_alias=True))


async def refuse(bus: Bus, submit: RunSubmit, subject: str, reason: str, msg_id: str | None = None) -> None:
    """A submit the planner does not start: dead-lettered with the reason, nothing stored or published."""
    body = submit.model_dump_json(by_alias=True)
    letter = DeadLetter(service="planner", subject=S.as_sent(subject), reason=reason, body=body)
    await bus.publish(
        S.dead_letter("planner"), letter, msg_id=msg_id or ids.refused_submit(submit.run_id, digest_of(body))
    )
    log.error("planner: refused the submit of %s: %s", submit.run_id, reason)


async def unbind_stray_scenario(bus: Bus, run_id: str, taken: Callable[[], Awaitable[bool]] | None = None) -> None:
    """A run submitted without a scenario is live: a scenario stored under its id by anyone else (an
    admin could) is removed before the run starts, so nothing treats the run as scripted. ``taken``: whether
    the id is another run's already (a submit at the door creates its record after this): then the scenario is
    that run's own, bound to it, and stays (the record's create finds the id taken)."""
    kv = await bus.kv(S.KV_SCENARIOS)
    try:
        stray = await kv.get(run_id)  # read raw: an unreadable one is removed too
    except KeyNotFoundError:
        stray = None
    if stray is not None and stray.value is not None and stray.operation not in ("DEL", "PURGE"):
        if taken is not None and await taken():
            return
        await kv.delete(run_id)
        log.warning("planner: removed a scenario stored for live run %s before it started", run_id)
    keep_bound(bus, run_id, None)  # live: the run's first turn here reads nothing
