"""Planner bus handlers: thin translations between messages and the run state machine.

Each handler is a transaction: load the run (with its KV revision) -> skip if this
message was already applied (and re-publish what it produced, in case the process died
between saving and publishing) -> apply (``transaction.apply_message``) -> save with
compare-and-swap -> publish with deterministic ids -> the bus helper acks. A CAS conflict
reloads and applies again. The transaction returns the model turn a message scheduled; the
handler takes it (``model_turns``), and applies what the turn decided as one more transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import Literal

from pydantic import ValidationError

from services.planner import ids, submission
from services.planner.admission import Refused, admit, check_limits, is_replay, resolve_agent, with_agent
from services.planner.catalogue import Catalogue
from services.planner.escalations import apply_resolution
from services.planner.flow import Flow
from services.planner.intake import Intake
from services.planner.judging import apply_verdict
from services.planner.model_turns import ModelTurns
from services.planner.outbox import Outbox
from services.planner.outcomes import apply_outcome
from services.planner.reads import RunReads
from services.planner.removals import Removals, SentCommands
from services.planner.stall_watch import StallWatch
from services.planner.state import PublishRecord, RunState
from services.planner.store import RunStore
from services.planner.transaction import Applied, Change, apply_message
from services.planner.turns import Answered, apply_turn, resolve_config, start_run
from shared import metrics as M
from shared import subjects as S
from shared.bounded import bounded_outcome
from shared.bus import (
    Bus,
    CasConflict,
    FairGate,
    TryLater,
    Unchanged,
    current_deliveries,
    current_subject,
    tenant_scope,
)
from shared.describe import describe
from shared.failures import replaceable
from shared.messages import (
    TOOL_FAILURES,
    AgentRecord,
    Corrected,
    Decided,
    ErrorReply,
    EscalationRaise,
    EscalationResolution,
    FleetView,
    FlowQuery,
    RunAdvance,
    RunSubmit,
    ToolContract,
    ToolOutcome,
    Verdict,
    utcnow,
)
from shared.payloads import PayloadError
from shared.providers.select import provider_name
from shared.ratelimit.gate import RateLimiter
from shared.settings import Settings
from shared.telemetry import LW_ITERATION, LW_RUN_ID, Telemetry, current_traceparent, record_invoke_agent

log = logging.getLogger("loopwarden.planner")
CMD = f"{S.P}.cmd."


class Planner:
    def __init__(self, bus: Bus, settings: Settings, telemetry: Telemetry) -> None:
        self.bus, self.settings = bus, settings
        self.tracer = telemetry.tracer("loopwarden.planner")
        self.tracing = telemetry.exporting
        meter = telemetry.meter("loopwarden.planner")
        self.runs = M.RunMetrics(meter)  # started, finished by status, duration, cost and tokens; by tenant and agent
        self.decisions = M.Tally(meter, M.DECIDE_DECISIONS, description="Decide outcomes by row")
        cost = M.Tally(meter, M.MODEL_COST, unit="USD", description="billed model cost")
        self.corrections = M.Tally(
            meter, M.TOOL_CORRECTIONS, description="schema-failure streaks by outcome: recovered, escalated"
        )
        self.catalogue = Catalogue(bus)
        # Runs: the record and its history, and what this replica last stored or read of each
        # (a transaction tries its CAS on that without reading first; a conflict re-reads).
        self.store = RunStore(bus)
        # saving a run and publishing what it produced: given to tenants by fair share (``LW_DISPATCH_COMMITS``)
        # while another tenant has messages in this replica (a tenant alone runs every commit at once)
        self.commits = FairGate(settings.dispatch_commits, settings.dispatch_headroom, bus.presence)
        # gen_ai.client.token.usage / .operation.duration are recorded per model call
        limiter = RateLimiter(bus, settings, telemetry.meter("loopwarden.ratelimit"))
        leased = M.Tally(
            meter, M.BUDGET_LEASED_TURNS, description="model turns taken on a budget decision's lease, without asking"
        )
        self.turns = ModelTurns(
            bus, settings, self.store, self.catalogue, self.tracer, telemetry.gen_ai, cost, limiter, leased
        )
        self.fault = settings.fault_inject  # TEST ONLY (tests/test_run_history.py, tests/test_inline_turns.py)
        if self.fault is not None:
            log.warning("TEST FAULT INJECTION: this planner exits at %s", self.fault)
        # admission to the fleet (fair share between tenants) and the door (quotas, refusals)
        self.flow = Flow(bus, settings, telemetry, lambda run_id: self.intake.begin(run_id))
        self.intake = Intake(self, self.flow)
        # the commands it published per run, removed from LW_CMD once the run ended and each was handled
        self.sent, self.commands = SentCommands(), Removals(bus, S.STREAM_CMD, "command")

    def saved(self) -> None:
        """The record is stored; nothing of this step is published or appended to the history yet."""
        if self.fault == "after_run_saved":
            os._exit(70)

    async def contracts(self, refresh: bool = False) -> dict[str, ToolContract]:
        return await self.catalogue.contracts(refresh)

    async def stored_agent(self, name: str) -> AgentRecord | None:
        """The registered agent ``name``; one whose stored value does not read as an agent is a refusal of the
        submit (a letter saying so), not a failure retried until the delivery budget is spent (review 4, L2)."""
        try:
            record, _ = await self.bus.kv_get(S.KV_AGENTS, name, AgentRecord)
        except (ValidationError, PayloadError) as err:
            why = describe(err) if isinstance(err, ValidationError) else str(err)
            raise Refused(
                f"agent {name!r} is stored but cannot be read ({why}); an operator registers it again"
            ) from None
        return record

    def register(self) -> None:
        b = self.bus
        # the door, by partition (one tenant's burst never in front of another tenant's submits:
        # ``S.SUBMIT_PARTITIONS``); and the operators' replays (``S.run_replay``) with the submits stored before it
        # was partitioned
        for k in range(S.SUBMIT_PARTITIONS):
            b.consumer(durable=S.submit_durable(k), filter_subjects=[S.submit_partition(k)], model=RunSubmit)(
                self.on_submit
            )
        b.consumer(
            durable=S.DURABLE_PLANNER_SUBMIT,
            filter_subjects=[f"{S.RUN_SUBMIT_PREFIX}.*", f"{S.RUN_SUBMIT_PREFIX}.*.{S.REPLAY}"],
            model=RunSubmit,
        )(self.on_submit)
        b.consumer(durable=S.DURABLE_PLANNER_SPAWN, filter_subjects=[S.RUN_SPAWN], model=RunSubmit)(self.on_submit)
        b.consumer(durable=S.DURABLE_PLANNER_ADVANCE, filter_subjects=[S.RUN_ADVANCE], model=RunAdvance)(
            self.on_advance
        )
        b.consumer(
            durable=S.DURABLE_PLANNER_OUTCOMES,
            stream=S.STREAM_EVT,
            model=ToolOutcome,
            filter_subjects=[f"{S.TOOL_SUCCEEDED_PREFIX}.>", *(f"{S.FAILURE_PREFIX}.{t}.>" for t in TOOL_FAILURES)],
        )(self.on_outcome)
        b.consumer(
            durable=S.DURABLE_PLANNER_VERDICTS,
            stream=S.STREAM_EVT,
            filter_subjects=[S.any_run(S.JUDGE_VERDICT)],
            model=Verdict,
        )(self.on_verdict)
        b.consumer(
            durable=S.DURABLE_PLANNER_RESOLUTIONS,
            stream=S.STREAM_EVT,
            filter_subjects=[S.any_run(S.ESCALATION_RESOLVED)],
            model=EscalationResolution,
        )(self.on_resolution)
        RunReads(b).register()  # a tenant-bound client's reads of its own runs (``rpc.runs.<verb>.<tenant>``)
        for subject in (S.FLOW_VIEW, f"{S.FLOW_VIEW}.*"):  # the fleet's view (``loopwarden fleet``)
            b.subject_responder(subject=subject, model=FlowQuery, reply=lambda reason: ErrorReply(error=reason))(
                self.on_flow_view
            )
        self.watch = StallWatch(self)  # dead letters and missing replicas: runs marked stalled (``stalls.py``)
        self.watch.register()

    def traceparent(self) -> str:
        return current_traceparent() if self.tracing else ""

    # --- the transaction -----------------------------------------------------------------------
    async def transact(self, run_id: str, msg_id: str, change: Change, take_turn: bool = False) -> RunAdvance | None:
        """Apply one message to the run under CAS, then publish what it produced.

        With ``take_turn`` (an outcome, a verdict, a resolution), when what it produced schedules
        the run's next model turn, that turn is returned instead of published: the caller takes it
        here, before the message is acked, instead of publishing the advance and taking it from the
        advance consumer: one hand-off through the server fewer on every step. The advance stays in
        the message's outbox, so a redelivery of the message (this process died during the turn, or
        the turn said try later) takes the turn again from there: on a redelivery the model's stored
        answer is reused, as for a redelivered advance, and a planner that does not take turns inline
        publishes the advance.
        """
        change = self.traced(run_id, msg_id, change)
        before = ""

        def step(state: RunState | None) -> tuple[RunState, Applied] | Unchanged[Applied | None]:
            nonlocal before
            if state is None:
                raise TryLater(f"run {run_id} is not stored yet", delay=1.0)
            before = state.status
            applied = apply_message(state, msg_id, change)
            if applied is None or not applied.changed:
                return Unchanged(applied)
            if not applied.was_done:
                self.turns.prefetch(state, applied.items)  # the next turn's budget ask travels while this is saved
            return state, applied

        async with self.commits.section():
            applied = await self.store.update(run_id, step)
            if applied is None:
                return None
            self.saved()
            if not applied.was_done:
                self.turns.prefetch_saved(applied.state)
            items, turn = applied.scheduled() if take_turn else (applied.items, None)
            await self.committed(run_id, [(msg_id, applied, items)], before)
        return turn

    async def committed(
        self, run_id: str, done: list[tuple[str, Applied, list[PublishRecord]]], before: str = ""
    ) -> None:
        """After the save that carried them: each applied message's ``items`` published (in order, acks
        awaited together) while the step's messages are appended to the history; then counted. A run that
        ended or waits for a person (``before``: its status before the save) gives its slot in the fleet back."""
        state = done[-1][1].state
        items = [i for _, _, some in done for i in some]
        state.published_bytes += sum(len(i.payload) for i in items)  # kept with its next save (its stored bytes)
        # the next step's work goes out while the step's messages are appended to the history
        await asyncio.gather(self.publish(items, run_id, state.tenant), self.store.store_tail(state))
        for msg_id, _, some in done:
            state.published(msg_id, some)  # the next save stops carrying them
        if before and any(applied.changed for _, applied, _ in done):
            self.flow.moved(state, before)
        for _, applied, _ in done:
            if not applied.was_done:
                self.count(applied.items)
        if any(not applied.was_done for _, applied, _ in done) and state.done:
            self.turns.leases.drop(run_id)
            self.finished(state)
            if self.tracing:
                self.agent_span(state)
            await submission.record_lessons(self.bus, state)
            await self.settle(state)
            for seq in self.sent.ended(run_id, state.applied):  # handled for good: nothing reads them again
                self.commands.remove(seq)

    async def settle(self, state: RunState) -> None:
        """The run ended and its last outbox is published: its record is saved once more, without what only a
        running run reads (``RunState.settle``): a finished run keeps about half the bytes. Best effort: a
        record another replica moved on meanwhile keeps what it has."""
        revision = self.store.revision(state)
        if revision is None:
            return
        state.settle()
        with contextlib.suppress(CasConflict):
            await self.store.save(state, revision)

    async def handle(self, run_id: str, msg_id: str, change: Change) -> None:
        """A message that may schedule the run's next model turn: applied, then that turn taken here.
        When this replica holds the run's record, the message and the turn it schedules are saved
        together, in one write (``with_turn``); otherwise, or when that write loses its compare-and-swap,
        the message is saved first and the turn taken after it."""
        together = await self.with_turn(run_id, msg_id, change)
        if together == "saved":
            return
        turn = await self.transact(run_id, msg_id, change, take_turn=True)
        if turn is not None:  # a turn taken already (``taken``) has its answer stored: reused, not paid twice
            await self.on_advance(turn, inline=True, stored=together == "taken")

    async def with_turn(self, run_id: str, msg_id: str, change: Change) -> Literal["saved", "taken", "no"]:
        """Apply ``msg_id`` to the run as this replica holds it and, when that schedules the run's next
        model turn, take the turn and save both in one compare-and-swap, then publish what both produced
        (one write of the record per step instead of two). Nothing is published before that save, so a crash
        anywhere before it leaves the stored record as it was: the redelivered message is applied again and
        the turn taken again, reusing the model's stored answer. A message that schedules no turn is saved
        alone, as ``transact`` would. "no": nothing was saved (the run is not held by this replica, the message
        changed nothing, or its save lost its compare-and-swap): the caller goes the usual way; "taken": the
        turn was taken but not saved (the save lost its compare-and-swap, or the turn compacted the history,
        which is applied to the record as stored): the caller saves the message the usual way and takes the
        turn again with the stored answer."""
        kept = self.store.kept(run_id)
        if kept is None or self.tracing:  # traced: a span per applied message, as the usual way makes
            return "no"
        state, revision = kept
        if state.seen(msg_id):
            return "no"
        self.store.forget(run_id)  # changed below in memory: until it is saved, the next read is the record's
        before = state.status
        applied = apply_message(state, msg_id, change)
        if applied is None or not applied.changed:
            return "no"
        items, turn = applied.scheduled()
        if turn is None or applied.was_done or not self.takes(state, turn):
            try:  # nothing to take here: saved alone
                await self.store.save(state, revision)
            except CasConflict:
                return "no"
            self.saved()
            await self.committed(run_id, [(msg_id, applied, items)], before)
            return "saved"
        advanced = ids.advanced(turn.iteration)
        taken = await self.turns.take(state, turn, current_deliveries() > 1)
        try:
            if isinstance(taken.result, Answered) and taken.result.compaction is not None:
                return "taken"  # ``take`` compacted ``state`` for the request: the record as stored gets it
            turned = apply_message(state, advanced, lambda s: apply_turn(s, taken.result))
            if turned is None:
                return "taken"
            async with self.commits.section():
                try:
                    await self.store.save(state, revision)
                except CasConflict:
                    return "taken"  # another replica moved the run: the usual way applies the message to it
                self.saved()
                await self.committed(run_id, [(msg_id, applied, items), (advanced, turned, turned.items)], before)
        finally:
            if taken.storing is not None:
                await taken.storing
        return "saved"

    def traced(self, run_id: str, msg_id: str, change: Change) -> Change:
        """``change`` inside a span per applied message, when spans are exported."""
        if not self.tracing:
            return change

        def within(state: RunState) -> Outbox | None:
            with self.tracer.start_as_current_span(
                f"planner apply {msg_id.split('.')[0]}", attributes={LW_RUN_ID: run_id, LW_ITERATION: state.iteration.n}
            ):
                return change(state)

        return within

    def agent_span(self, state: RunState) -> None:
        record_invoke_agent(
            self.tracer,
            run_id=state.run_id,
            started_at=state.created_at,
            traceparent=state.trace_parent,
            status=state.status,
            model=state.model or state.config.model,
            input_tokens=state.usage.input_tokens,
            output_tokens=state.usage.output_tokens,
            iterations=state.iteration.n,
            reason=state.final_reason,
        )

    async def publish(self, items: list[PublishRecord], run_id: str, tenant: str | None) -> None:
        """The outbox at once (acks awaited together): commands that start the next piece of work
        first, then the events in their order (the run's final event stays last). Every message carries the
        run's tenant and its weight (``Lw-Tenant``): each consumer downstream serves tenants by fair share."""
        ordered = [i for i in items if i.subject.startswith(CMD)] + [i for i in items if not i.subject.startswith(CMD)]
        own = [i for i in ordered if i.run_id is None]
        tenant = tenant or S.DEFAULT_TENANT
        with tenant_scope(tenant, self.flow.policies.known(tenant).weight):
            acks = await self.bus.publish_all([(i.subject, i.payload.encode(), i.msg_id) for i in own], run_id=run_id)
            self.sent.published(run_id, [i.msg_id if i.subject.startswith(CMD) else None for i in own], acks)
            for i in ordered:
                if i.run_id is not None:  # another run's message (a sub-agent's answer to its parent)
                    await self.bus.publish(i.subject, i.payload.encode(), msg_id=i.msg_id, run_id=i.run_id)

    def count(self, items: list[PublishRecord]) -> None:
        """Metrics of a message applied now, from the typed messages it produced."""
        for item in items:
            match item.message:
                case Decided(detail=decided):
                    self.decisions.add(1, {"action": decided.action, "row": decided.row})
                case Corrected(detail=corrected):
                    self.corrections.add(1, {"tool": corrected.tool, "outcome": "recovered"})
                case EscalationRaise(kind="schema_cap", tool=tool):
                    self.corrections.add(1, {"tool": str(tool), "outcome": "escalated"})

    def finished(self, state: RunState) -> None:
        """Metrics of a run that ended with the message applied now."""
        used, delegated = state.usage, state.delegated_usage  # its sub-agents' runs count their own
        self.runs.finished(
            state.status,
            state.tenant or S.DEFAULT_TENANT,
            state.agent,
            seconds=(utcnow() - state.created_at).total_seconds(),
            cost_usd=round(used.cost_usd - delegated.cost_usd, 8),
            input_tokens=used.input_tokens - delegated.input_tokens,
            output_tokens=used.output_tokens - delegated.output_tokens,
        )

    # --- handlers -------------------------------------------------------------------------------
    async def on_submit(self, submit: RunSubmit) -> None:
        """A client's submit (``cmd.run.submit.<tenant>``): taken at the door (``intake.py``), queued for its
        tenant's share of the fleet or refused; or a sub-agent run the planner spawned (``cmd.run.spawn``), started
        at once (its parent holds the slot: queueing it could deadlock the parent): admitted first (parent, limits,
        scenario), then started once."""
        subject = current_subject()
        if subject != S.RUN_SPAWN:  # a client's or an operator's: taken at the door (``intake.py``)
            await self.intake.take(submit, subject)
            return
        record: AgentRecord | None = None
        try:
            submit = admit(submit, subject, self.settings)
            if submit.agent is not None:  # a registered agent's run: its definition as of now
                record = await self.stored_agent(submit.agent)  # one over LW_VALUE_MAX_BYTES: refused unread
                submit = resolve_agent(submit, record, provider_name(self.settings, "planner"))
                check_limits(submit, self.settings)  # the agent's limits are capped like a submit's
        except Refused as err:
            await submission.refuse(self.bus, submit, subject, str(err))
            return
        existing = await self.store.load(submit.run_id, fresh=True)
        if submit.scenario is not None:
            problem = await submission.scenario_problem(
                self.bus, submit, started=existing is not None, replay=is_replay(subject)
            )
            if problem is not None:
                await submission.refuse(self.bus, submit, subject, problem, ids.refused_scenario(submit.run_id))
                return
        if existing is not None:
            await self.publish(existing.outbox.get(ids.SUBMIT, []), submit.run_id, existing.tenant)
            return
        if submit.scenario is None:
            await submission.unbind_stray_scenario(self.bus, submit.run_id)
        contracts = await self.contracts()
        lessons = await submission.lessons(self.bus, submit)
        config = with_agent(resolve_config(submit, self.settings, contracts), record)
        out = start_run(submit, config, lessons)
        out.state.agent, out.state.agent_version, out.state.tenant = config.agent, config.agent_version, submit.tenant
        out.state.remember(ids.SUBMIT, out.items)
        out.state.trace_parent = current_traceparent() if self.tracing else ""
        try:
            await self.store.create(out.state)
            self.saved()
        except CasConflict:
            existing = await self.store.load(submit.run_id, fresh=True)
            if existing is not None:
                await self.publish(existing.outbox.get(ids.SUBMIT, []), submit.run_id, existing.tenant)
            return
        self.runs.started(submit.tenant or S.DEFAULT_TENANT, config.agent)
        await asyncio.gather(self.publish(out.items, submit.run_id, submit.tenant), self.store.store_tail(out.state))
        out.state.published(ids.SUBMIT, out.items)

    async def on_flow_view(self, query: FlowQuery, subject: str) -> FleetView:
        """The fleet's view: every tenant's (``rpc.flow.view``), or the asking tenant's own row only
        (``rpc.flow.view.<tenant>``, the subject its user may publish)."""
        tenant = subject[len(S.FLOW_VIEW) + 1 :] if subject != S.FLOW_VIEW else query.tenant
        return await self.flow.view(tenant)

    async def on_outcome(self, outcome: ToolOutcome) -> None:
        if outcome.will_retry:
            return  # a transient failure the executor goes on from: not the call's outcome
        # the run state is a KV value: it keeps a bounded form of a large result, never megabytes
        outcome = bounded_outcome(outcome, self.settings.run_state_result_max_bytes)
        await self.handle(
            outcome.run_id,
            ids.outcome(outcome.iteration, outcome.call_id, unknown=replaceable(outcome.failure_type)),
            lambda s: apply_outcome(s, outcome),
        )

    async def on_verdict(self, verdict: Verdict) -> None:
        await self.handle(verdict.run_id, ids.verdict(verdict.candidate_id), lambda s: apply_verdict(s, verdict))

    async def on_resolution(self, res: EscalationResolution) -> None:
        await self.handle(res.run_id, ids.resolution(res.escalation_id), lambda s: apply_resolution(s, res))

    @staticmethod
    def takes(state: RunState, ev: RunAdvance) -> bool:
        """Whether the run is (still) at the turn ``ev`` asks for."""
        return not state.done and state.iteration.n == ev.iteration and state.status == "running"

    async def on_advance(self, ev: RunAdvance, inline: bool = False, stored: bool = False) -> None:
        """Take the run's turn ``ev`` names: from the advance consumer, or ``inline`` where the message
        that scheduled it is handled (``handle``). What the turn decided is applied as one transaction."""
        msg_id = ids.advanced(ev.iteration)
        # A later turn comes through the advance consumer only when a planner of an earlier version
        # re-published the advance of a message whose inline turn may have stored its answer.
        stored = stored or current_deliveries() > 1 or (not inline and ev.iteration > 1)
        state = await self.store.load(ev.run_id)
        if state is not None and not state.seen(msg_id) and not self.takes(state, ev):
            state = await self.store.load(ev.run_id, fresh=True)  # what this replica kept may be behind
        if state is None:
            raise TryLater(f"run {ev.run_id} is not stored yet", delay=1.0)
        if state.seen(msg_id):
            await self.publish(state.outbox.get(msg_id, []), ev.run_id, state.tenant)
            return
        if not self.takes(state, ev):
            return  # stale: this iteration already moved on
        taken = await self.turns.take(state, ev, stored)
        try:
            await self.transact(ev.run_id, msg_id, lambda s: apply_turn(s, taken.result))
        finally:
            if taken.storing is not None:
                await taken.storing
