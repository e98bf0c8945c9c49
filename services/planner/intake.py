"""A client's submit at the door (``cmd.run.submit.<tenant>``): validated, checked against its tenant's quotas and
recorded as ``queued`` with its ticket, or refused at once with a typed reason its submitter reads. Little work
happens here: the run's first message, lessons and first turn wait until it is admitted (``Planner.begin``).

A refusal is a record too: status ``refused`` (final) with the ``Refusal`` (quota, limit, current figure, reason)
and a ``run.refused`` event, so ``Client.submit``/``wait`` and ``loopwarden submit`` end with it at once. What an
operator may need to look at (a submit the planner does not start: scripted runs off, limits over their caps, an
unknown agent, another tenant's name, a bad scenario) is also dead-lettered as before; a quota's refusal is not.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from opentelemetry import propagate
from opentelemetry.trace import Tracer

from services.planner import ids, submission
from services.planner.admission import Refused, admit, check_limits, is_replay, resolve_agent, tenant_of, with_agent
from services.planner.catalogue import Catalogue
from services.planner.flow import Flow
from services.planner.removals import Removals
from services.planner.starting import accepted_run
from services.planner.state import PublishRecord, RunState
from services.planner.store import RunStore
from services.planner.turns import begin_run, queue_run, refuse_run, resolve_config
from shared import metrics as M
from shared import subjects as S
from shared.aio import retrieved
from shared.bus import Bus, CasConflict, FairGate, Unchanged, current_deliveries, current_seq
from shared.messages import DEFAULT_PRIORITY, AgentRecord, Refusal, RunSubmit, utcnow
from shared.providers.select import provider_name
from shared.settings import Settings
from shared.telemetry import LW_RUN_ID

log = logging.getLogger("loopwarden.planner")


class Host(Protocol):
    """What the door uses of the planner."""

    bus: Bus
    settings: Settings
    store: RunStore
    catalogue: Catalogue
    runs: M.RunMetrics
    commits: FairGate  # the replica's commits, shared by tenant (``LW_DISPATCH_COMMITS``)

    tracing: bool
    tracer: Tracer

    async def publish(self, items: list[PublishRecord], run_id: str, tenant: str | None) -> None: ...
    def traceparent(self) -> str: ...
    def saved(self) -> None: ...
    async def stored_agent(self, name: str) -> AgentRecord | None: ...


class Intake:
    def __init__(self, planner: Host, flow: Flow) -> None:
        self.planner, self.flow = planner, flow
        self.bus, self.settings, self.store, self.catalogue = (
            planner.bus,
            planner.settings,
            planner.store,
            planner.catalogue,
        )
        self.handled = Removals(planner.bus, S.STREAM_SUBMIT, "submit")

    async def take(self, submit: RunSubmit, subject: str) -> None:
        """Take a submit at the door; once it is handled for good (its run recorded and what that produced
        published, or it was refused), it is removed from ``LW_SUBMIT`` (``removals.Removals``)."""
        await self._take(submit, subject)
        self.handled.remove(current_seq())

    async def _take(self, submit: RunSubmit, subject: str) -> None:
        try:
            tenant = tenant_of(subject)
        except Refused as err:  # no tenant to tell: for operators only
            await submission.refuse(self.bus, submit, subject, str(err))
            return
        try:
            submit = admit(submit, subject, self.settings)
        except Refused as err:
            await self.refuse(submit.model_copy(update={"tenant": tenant}), Refusal(reason=str(err)), subject)
            return
        # the tenant's figures the fleet's record does not hold are read while the submit is looked at: a read
        # of its own, awaited only once the submit is to be counted
        policy = await self.flow.policies.of(tenant)
        reading = asyncio.ensure_future(self.flow.outside(tenant, policy))
        try:
            checked = await self.check(submit, subject)
            if checked is None:
                return
            submit, record = checked
            outside = await reading
        finally:
            if not reading.done():
                reading.cancel()
            reading.add_done_callback(retrieved)
        priority = submit.priority if submit.priority is not None else DEFAULT_PRIORITY
        over, at_once = await self.flow.enqueue(policy, priority, outside, submit.run_id)
        if over is not None:
            await self.refuse(submit, over, subject, letter=False)
            return
        config = with_agent(resolve_config(submit, self.settings, await self.catalogue.contracts()), record)
        async with self.planner.commits.section(tenant, policy.weight):  # shared with every tenant's commits
            if at_once:  # nothing waits and there is room: it starts now, without a ticket or a queued event
                await self.start(submit, accepted_run(submit, config, priority), is_replay(subject))
                return
            out = queue_run(submit, config, priority)
            out.state.pending_scenario = submit.scenario  # bound when it starts (``Planner.begin``)
            out.state.pending_replay = is_replay(subject)
            if await self.record(out.state, out.items):
                self.flow.queued()
            else:  # counted as waiting, but the run id is taken: it does not wait
                self.flow.dequeue(tenant, priority)

    async def check(self, submit: RunSubmit, subject: str) -> tuple[RunSubmit, AgentRecord | None] | None:
        """The submit as it is to be counted (a registered agent's definition resolved into it) and that agent's
        record; None: it was handled here (a run already stored, or refused: an agent that cannot be run, its
        limits over their caps, a bad scenario)."""
        if await self.known(submit, subject):
            return None
        record: AgentRecord | None = None
        try:
            if submit.agent is not None:  # a registered agent's run: its definition as of now
                record = await self.planner.stored_agent(submit.agent)
                submit = resolve_agent(submit, record, provider_name(self.settings, "planner"))
                check_limits(submit, self.settings)  # the agent's limits are capped like a submit's
        except Refused as err:
            await self.refuse(submit, Refusal(reason=str(err)), subject)
            return None
        problem = submission.scenario_error(submit) if submit.scenario is not None else None
        if problem is not None:
            await self.refuse(submit, Refusal(reason=problem), subject, msg_id=ids.refused_scenario(submit.run_id))
            return None
        return submit, record

    async def start(self, submit: RunSubmit, state: RunState, replay: bool) -> None:
        """A run that took its slot at the door: its scenario bound, its lessons read, its first message and
        first turn, stored and published as its submit's outcome (a redelivered submit publishes it again)."""
        if submit.scenario is not None:
            problem = await submission.bind_scenario(self.bus, submit.run_id, submit.scenario, replay)
        else:
            problem = None
            await submission.unbind_stray_scenario(self.bus, submit.run_id, taken=lambda: self.stored(submit.run_id))
        lessons = await submission.lessons_for(self.bus, state.task, state.tenant, state.agent, state.config.lessons)
        out = begin_run(state, lessons, state.created_at, problem)
        assert out is not None
        if not await self.record(state, out.items):
            self.flow.release_now(state.tenant or S.DEFAULT_TENANT, state.run_id)  # the run id is taken
        elif state.done:  # its rubric, or its scenario, was refused at the start: the slot goes back
            self.flow.moved(state, "queued")
        else:
            self.planner.runs.started(state.tenant or S.DEFAULT_TENANT, state.agent)

    async def stored(self, run_id: str) -> bool:
        """Whether a run's record is stored under ``run_id``."""
        return await self.store.load(run_id, fresh=True) is not None

    async def begin(self, run_id: str) -> str | None:
        """Start a queued run its tenant's share of the fleet was just given to (``Flow``): its first message,
        lessons and first turn. Its status after (None: no record); a run no longer queued is left as it is, but
        what its start produced and did not publish yet (the replica that started it died) is published. The
        start continues the submit's trace (kept in the record), so the run stays one trace."""
        # the state this replica kept is the record (only a start changes a queued run, under CAS), else it is read
        state = await self.store.load(run_id)
        if state is None:
            return None
        if not self.planner.tracing or not state.trace_parent:
            return await self._begin(state)
        submitted = propagate.extract({"traceparent": state.trace_parent})
        with self.planner.tracer.start_as_current_span(
            "planner start", context=submitted, attributes={LW_RUN_ID: run_id}
        ):
            return await self._begin(state)

    async def _begin(self, state: RunState) -> str | None:
        run_id = state.run_id
        if state.status != "queued":
            if state.outbox.get(ids.ADMITTED):
                await self.planner.publish(state.outbox[ids.ADMITTED], run_id, state.tenant)
            return state.status
        if state.pending_scenario is not None:  # a scripted run: its scenario is bound to it now
            problem = await submission.bind_scenario(self.bus, run_id, state.pending_scenario, state.pending_replay)
        else:  # a live run: whatever is stored under its id is not its scenario
            problem = None
            await submission.unbind_stray_scenario(self.bus, run_id)
        lessons = await submission.lessons_for(self.bus, state.task, state.tenant, state.agent, state.config.lessons)
        at = utcnow()

        def step(state: RunState | None) -> tuple[RunState, RunState] | Unchanged[RunState | None]:
            if state is None or state.seen(ids.ADMITTED):
                return Unchanged(state)
            out = begin_run(state, lessons, at, problem)
            if out is None:
                return Unchanged(state)
            state.remember(ids.ADMITTED, out.items)
            state.published_bytes += sum(len(i.payload) for i in out.items)
            return state, state

        started = await self.store.update(run_id, step)
        if started is None:
            return None
        self.planner.saved()
        items = started.outbox.get(ids.ADMITTED, [])
        await asyncio.gather(self.planner.publish(items, run_id, started.tenant), self.store.store_tail(started))
        started.published(ids.ADMITTED, items)
        if started.status == "running":
            self.planner.runs.started(started.tenant or S.DEFAULT_TENANT, started.agent)
        self.flow.moved(started, "queued")  # a rubric refused at the start ends it here
        return started.status

    async def known(self, submit: RunSubmit, subject: str) -> bool:
        """A submit of a run stored already (a redelivery, or a run id taken): what it produced is published again
        (the server drops the copies) and nothing else happens. A first delivery reads nothing here: the record
        is created only if absent (``record``), which finds a run id taken. A submit with a scenario is read
        for always: one for a run id taken (by a run of another replica too) is refused, and its scenario never
        bound to that run (a live run is never made scripted)."""
        if current_deliveries() <= 1 and not self.store.kept(submit.run_id) and submit.scenario is None:
            return False
        existing = await self.store.load(submit.run_id, fresh=True)
        if existing is None:
            return False
        if submit.scenario is not None:
            problem = await submission.scenario_problem(self.bus, submit, started=True)
            if problem is not None:
                await submission.refuse(self.bus, submit, subject, problem, ids.refused_scenario(submit.run_id))
                return True
        await self.planner.publish(existing.outbox.get(ids.SUBMIT, []), submit.run_id, existing.tenant)
        if existing.status == "queued":
            self.flow.queued()
        return True

    async def record(self, state: RunState, items: list[PublishRecord]) -> bool:
        """Store a new run's record (create-only) and publish what its submit produced; False: the run id is
        taken (a redelivery raced this one, or another run's id): that record's answer is published again."""
        state.remember(ids.SUBMIT, items)
        state.trace_parent = self.planner.traceparent()
        state.published_bytes += sum(len(i.payload) for i in items)
        try:
            await self.store.create(state)
        except CasConflict:
            existing = await self.store.load(state.run_id, fresh=True)
            if existing is not None:
                await self.planner.publish(existing.outbox.get(ids.SUBMIT, []), state.run_id, existing.tenant)
            return False
        if state.status not in ("queued", "refused"):  # a run started at once (TEST ONLY fault point: after a save)
            self.planner.saved()
        await self.planner.publish(items, state.run_id, state.tenant)
        state.published(ids.SUBMIT, items)
        return True

    async def refuse(
        self, submit: RunSubmit, why: Refusal, subject: str, *, letter: bool = True, msg_id: str | None = None
    ) -> None:
        """The submit is refused: a ``refused`` record and event its submitter reads (unless the run id is taken),
        and for what an operator may need to see, the dead letter as before."""
        out = refuse_run(submit, why, resolve_config(submit, self.settings, {}))
        if await self.record(out.state, out.items):
            tenant = submit.tenant or S.DEFAULT_TENANT
            self.flow.refused.add(1, {"tenant": self.flow.tenant_label(tenant), "quota": why.quota or "admission"})
            log.warning("planner: refused the submit of %s (tenant %s): %s", submit.run_id, tenant, why.reason)
        if letter:
            await submission.refuse(self.bus, submit, subject, why.reason, msg_id)
