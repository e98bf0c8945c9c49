"""A client's submit at the door (``cmd.run.submit.<tenant>``): validated, checked against its tenant's quotas and
recorded as ``queued`` with its ticket, or refused at once with a typed reason its submitter reads. Little work
happens here: the run's first message, lessons and first turn wait until it is admitted (``Planner.begin``).

A refusal is a record too: status ``refused`` (final) with the ``Refusal`` (quota, limit, current figure, reason)
and a ``run.refused`` event, so ``Client.submit``/``wait`` and ``loopwarden submit`` end with it at once. What an
operator may need to look at (a submit the planner does not start: scripted runs off, limits over their caps, an
unknown agent, another tenant's name, a bad scenario) is also dead-lettered as before; a quota's refusal is not.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from services.planner import ids, submission
from services.planner.admission import Refused, admit, check_limits, resolve_agent, tenant_of, with_agent
from services.planner.catalogue import Catalogue
from services.planner.flow import Flow
from services.planner.state import PublishRecord, RunState
from services.planner.store import RunStore
from services.planner.turns import begin_run, queue_run, refuse_run, resolve_config
from shared import subjects as S
from shared.bus import Bus, CasConflict, current_deliveries
from shared.messages import DEFAULT_PRIORITY, AgentRecord, Refusal, RunSubmit
from shared.providers.select import provider_name
from shared.settings import Settings

log = logging.getLogger("loopwarden.planner")
Publish = Callable[[list[PublishRecord], str], Awaitable[None]]


class Intake:
    def __init__(
        self,
        bus: Bus,
        settings: Settings,
        store: RunStore,
        catalogue: Catalogue,
        flow: Flow,
        publish: Publish,
        trace_parent: Callable[[], str],
        saved: Callable[[], None],
    ) -> None:
        self.bus, self.settings, self.store, self.catalogue, self.flow = bus, settings, store, catalogue, flow
        self.publish, self.trace_parent, self.saved = publish, trace_parent, saved

    async def take(self, submit: RunSubmit, subject: str) -> None:
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
        if await self.known(submit, subject):
            return
        record: AgentRecord | None = None
        try:
            if submit.agent is not None:  # a registered agent's run: its definition as of now
                record, _ = await self.bus.kv_get(S.KV_AGENTS, submit.agent, AgentRecord)
                submit = resolve_agent(submit, record, provider_name(self.settings, "planner"))
                check_limits(submit, self.settings)  # the agent's limits are capped like a submit's
        except Refused as err:
            await self.refuse(submit, Refusal(reason=str(err)), subject)
            return
        problem = submission.scenario_error(submit) if submit.scenario is not None else None
        if problem is not None:
            await self.refuse(submit, Refusal(reason=problem), subject, msg_id=ids.refused_scenario(submit.run_id))
            return
        priority = submit.priority if submit.priority is not None else DEFAULT_PRIORITY
        policy = await self.flow.policies.of(tenant)
        outside = await self.flow.outside(tenant, policy)
        over, at_once = await self.flow.enqueue(policy, priority, outside, submit.run_id)
        if over is not None:
            await self.refuse(submit, over, subject, letter=False)
            return
        config = with_agent(resolve_config(submit, self.settings, await self.catalogue.contracts()), record)
        out = queue_run(submit, config, priority)
        if at_once:  # nothing waits and there is room: it starts now, without a ticket
            await self.start(submit, out.state)
            return
        out.state.pending_scenario = submit.scenario  # bound when it starts (``Planner.begin``)
        if await self.record(out.state, out.items):
            self.flow.queued()
        else:  # counted as waiting, but the run id is taken: it does not wait
            self.flow.dequeue(tenant, priority)

    async def start(self, submit: RunSubmit, state: RunState) -> None:
        """A run that took its slot at the door: its scenario bound, its lessons read, its first message and
        first turn, stored and published as its submit's outcome (a redelivered submit publishes it again)."""
        if submit.scenario is not None:
            problem = await submission.bind_scenario(self.bus, submit.run_id, submit.scenario)
        else:
            problem = None
            await submission.unbind_stray_scenario(self.bus, submit.run_id)
        lessons = await submission.lessons_for(self.bus, state.task, state.config.lessons)
        out = begin_run(state, lessons, state.created_at, problem)
        assert out is not None
        if not await self.record(state, out.items):
            self.flow.release_now(state.tenant or S.DEFAULT_TENANT, state.run_id)  # the run id is taken
        elif state.done:  # its rubric, or its scenario, was refused at the start: the slot goes back
            self.flow.moved(state, "queued")

    async def known(self, submit: RunSubmit, subject: str) -> bool:
        """A submit of a run stored already (a redelivery, or a run id taken): what it produced is published again
        (the server drops the copies) and nothing else happens. A first delivery reads nothing here: the record
        is created only if absent (``record``), which finds a run id taken."""
        if current_deliveries() <= 1 and not self.store.kept(submit.run_id):
            return False
        existing = await self.store.load(submit.run_id, fresh=True)
        if existing is None:
            return False
        if submit.scenario is not None:
            problem = await submission.scenario_problem(self.bus, submit, started=True)
            if problem is not None:
                await submission.refuse(self.bus, submit, subject, problem, ids.refused_scenario(submit.run_id))
                return True
        await self.publish(existing.outbox.get(ids.SUBMIT, []), submit.run_id)
        if existing.status == "queued":
            self.flow.queued()
        return True

    async def record(self, state: RunState, items: list[PublishRecord]) -> bool:
        """Store a new run's record (create-only) and publish what its submit produced; False: the run id is
        taken (a redelivery raced this one, or another run's id): that record's answer is published again."""
        state.remember(ids.SUBMIT, items)
        state.trace_parent = self.trace_parent()
        state.published_bytes += sum(len(i.payload) for i in items)
        try:
            await self.store.create(state)
        except CasConflict:
            existing = await self.store.load(state.run_id, fresh=True)
            if existing is not None:
                await self.publish(existing.outbox.get(ids.SUBMIT, []), state.run_id)
            return False
        if state.status not in ("queued", "refused"):  # a run started at once (TEST ONLY fault point: after a save)
            self.saved()
        await self.publish(items, state.run_id)
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
            self.flow.refused.add(1, {"tenant": tenant, "quota": why.quota or "admission"})
            log.warning("planner: refused the submit of %s (tenant %s): %s", submit.run_id, tenant, why.reason)
        if letter:
            await submission.refuse(self.bus, submit, subject, why.reason, msg_id)
