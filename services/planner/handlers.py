"""Planner bus handlers: thin translations between messages and the run state machine.

Each handler is a transaction: load the run (with its KV revision) -> skip if this
message was already applied (and re-publish what it produced, in case the process died
between saving and publishing) -> apply -> save with compare-and-swap -> publish with
deterministic ids -> the bus helper acks. A CAS conflict reloads and applies again.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import KeyNotFoundError, NotFoundError
from pydantic import Field

from services.planner import context as C
from services.planner import ids
from services.planner.admission import Refused, admit, check_limits, resolve_agent, with_agent
from services.planner.escalations import apply_resolution
from services.planner.hosting import Hosting
from services.planner.judging import apply_verdict
from services.planner.outbox import Outbox
from services.planner.outcomes import apply_outcome
from services.planner.reads import RunReads
from services.planner.state import PublishRecord, RunState, is_own_advance
from services.planner.store import RunStore
from services.planner.turns import (
    apply_compaction,
    apply_guard,
    apply_model_response,
    apply_model_stop,
    apply_provider_failure,
    apply_wrap_up,
    resolve_config,
    start_run,
)
from shared import subjects as S
from shared.backoff import BackoffPolicy
from shared.bounded import bounded_outcome
from shared.bus import Bus, CasConflict, RequestRefused, TryLater, Unchanged, current_deliveries, current_subject
from shared.canonical import digest_of
from shared.messages import (
    TOOL_FAILURES,
    AgentRecord,
    BudgetDecision,
    BudgetRequest,
    ChatMessage,
    Corrected,
    DeadLetter,
    Decided,
    EscalationRaise,
    EscalationResolution,
    RunAdvance,
    RunSubmit,
    ToolContract,
    ToolOutcome,
    Usage,
    Verdict,
    Wire,
)
from shared.providers.base import ModelRequest, ModelResponse, ProviderError, StopReasonError, complete_with_retry
from shared.providers.select import provider_name, run_provider
from shared.scenario import Scenario, ScenarioError, parse_scenario
from shared.settings import Settings
from shared.telemetry import LW_ITERATION, LW_RUN_ID, Telemetry, current_traceparent, record_invoke_agent

log = logging.getLogger("loopwarden.planner")
CMD = f"{S.P}.cmd."


@dataclass
class Applied:
    state: RunState
    items: list[PublishRecord]
    was_done: bool


@dataclass
class Prefetched:
    """A turn's budget decision, asked for as soon as the transaction that schedules the turn is
    applied (while it is saved): the turn uses it when it starts from the very state the request
    was built from, saved (``revision``), with the same catalogue; otherwise it asks as before (the
    governor answers once per (run, turn), so both asks get the same decision)."""

    turn: int
    state: RunState
    contracts: dict[str, ToolContract]
    planned: ModelRequest
    decision: asyncio.Future[BudgetDecision]
    revision: int | None = None  # what the state was saved at (None: not saved, never used)

    def fits(self, state: RunState, revision: int | None, contracts: dict[str, ToolContract]) -> bool:
        return (
            state is self.state
            and revision is not None
            and revision == self.revision
            and state.iteration.n == self.turn
            and contracts is self.contracts
        )


CONTRACTS_FRESH_S = 2.0  # how long a listing of the registered tools is used before listing again
PREFETCHED_MAX = 1024  # runs whose next turn's decision a replica holds at once


def _retrieved(task: asyncio.Future[BudgetDecision]) -> None:
    """A prefetch nobody awaited (its turn asked again, or it was dropped) must not log an unretrieved error."""
    if not task.cancelled():
        task.exception()


class Lessons(Wire):
    reasons: list[str] = Field(default_factory=list)


def lessons_key(task: str) -> str:
    return "task-" + hashlib.sha256(task.strip().lower().encode()).hexdigest()[:24]


class Planner:
    def __init__(self, bus: Bus, settings: Settings, telemetry: Telemetry) -> None:
        self.bus, self.settings = bus, settings
        self.tracer = telemetry.tracer("loopwarden.planner")
        self.tracing = telemetry.exporting
        meter = telemetry.meter("loopwarden.planner")
        self.runs_finished = meter.create_counter("loopwarden.runs.finished", description="runs by final status")
        self.decisions = meter.create_counter("loopwarden.decide.decisions", description="Decide outcomes by row")
        self.gen_ai = telemetry.gen_ai  # gen_ai.client.token.usage / .operation.duration, per model call
        self.cost = meter.create_counter("loopwarden.model.cost", unit="USD", description="billed model cost")
        self.corrections = meter.create_counter(
            "loopwarden.tool.corrections", description="schema-failure streaks by outcome: recovered, escalated"
        )
        self._contracts: tuple[float, dict[str, ToolContract]] = (0.0, {})
        self._contracts_fetch: asyncio.Task[dict[str, ToolContract]] | None = None  # one listing at a time
        # a called tool no running executor replica hosts (through the grace): unknown_tool
        self.hosting = Hosting(self.hosted, grace_s=self.settings.tool_host_grace_s)
        # Runs: the record and its history, and what this replica last stored or read of each
        # (a transaction tries its CAS on that without reading first; a conflict re-reads).
        self.store = RunStore(bus)
        self.prefetched: OrderedDict[str, Prefetched] = OrderedDict()  # per run: its next turn's budget decision
        self.fault = settings.fault_inject  # TEST ONLY (tests/test_run_history.py, tests/test_inline_turns.py)
        if self.fault is not None:
            log.warning("TEST FAULT INJECTION: this planner exits at %s", self.fault)

    def saved(self) -> None:
        """The record is stored; nothing of this step is published or appended to the history yet."""
        if self.fault == "after_run_saved":
            os._exit(70)

    async def load(self, run_id: str, fresh: bool = False) -> RunState | None:
        return await self.store.load(run_id, fresh)

    def register(self) -> None:
        b = self.bus
        b.consumer(durable=S.DURABLE_PLANNER_SUBMIT, filter_subjects=[f"{S.RUN_SUBMIT_PREFIX}.*"], model=RunSubmit)(
            self.on_submit
        )
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

    # --- the transaction -----------------------------------------------------------------------
    async def transact(
        self, run_id: str, msg_id: str, apply: Callable[[RunState], Outbox | None], take_turn: bool = False
    ) -> None:
        """Apply one message to the run under CAS, then publish what it produced.

        With ``take_turn`` (an outcome, a verdict, a resolution), when what it produced schedules
        the run's next model turn, this replica takes that turn here, before the message is acked,
        instead of publishing the advance and taking it from the advance consumer: one hand-off
        through the server fewer on every step. The advance stays in the message's outbox, so a
        redelivery of the message (this process died during the turn, or the turn said try later)
        takes the turn again from there: on a redelivery the model's stored answer is reused, as for
        a redelivered advance, and a planner that does not take turns inline publishes the advance.
        """

        def step(state: RunState | None) -> tuple[RunState, Applied] | Unchanged[Applied | None]:
            if state is None:
                raise TryLater(f"run {run_id} is not stored yet", delay=1.0)
            if state.seen(msg_id):  # applied before: re-publish its outbox (deduplicated downstream)
                return Unchanged(Applied(state, state.outbox.get(msg_id, []), was_done=True))
            was_done = state.done
            if self.tracing:
                with self.tracer.start_as_current_span(
                    f"planner apply {msg_id.split('.')[0]}",
                    attributes={LW_RUN_ID: run_id, LW_ITERATION: state.iteration.n},
                ):
                    out = apply(state)
            else:
                out = apply(state)
            if out is None:
                return Unchanged(None)
            state.remember(msg_id, out.items)  # applied once: a redelivery re-publishes, never re-applies
            if not was_done:
                self.prefetch(state, out.items)  # the next turn's budget ask travels while this is saved
            return state, Applied(state, out.items, was_done)

        applied = await self.store.update(run_id, step)
        if applied is None:
            return
        self.saved()
        if not applied.was_done:
            self.prefetch_saved(applied.state)
        items, turn = applied.items, None
        if take_turn:
            items, turn = without_advance(items)
        # the next step's work goes out while the step's messages are appended to the history
        await asyncio.gather(self.publish(items, run_id), self.store.store_tail(applied.state))
        applied.state.published(msg_id, items)  # the next save stops carrying them
        if not applied.was_done:
            self.count(applied.items, applied.state)
            if applied.state.done:
                if self.tracing:
                    self.agent_span(applied.state)
                await self.record_lessons(applied.state)
        if turn is not None:
            await self.on_advance(turn, inline=True)

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

    async def publish(self, items: list[PublishRecord], run_id: str) -> None:
        """The outbox at once (acks awaited together): commands that start the next piece of work
        first, then the events in their order (the run's final event stays last)."""
        ordered = [i for i in items if i.subject.startswith(CMD)] + [i for i in items if not i.subject.startswith(CMD)]
        own = [i for i in ordered if i.run_id is None]
        await self.bus.publish_all([(i.subject, i.payload.encode(), i.msg_id) for i in own], run_id=run_id)
        for i in ordered:
            if i.run_id is not None:  # another run's message (a sub-agent's answer to its parent)
                await self.bus.publish(i.subject, i.payload.encode(), msg_id=i.msg_id, run_id=i.run_id)

    def count(self, items: list[PublishRecord], state: RunState) -> None:
        for item in items:
            if item.model == Decided.__name__:
                decided = Decided.model_validate_json(item.payload)
                self.decisions.add(1, {"action": decided.detail.action, "row": decided.detail.row})
            elif item.model == Corrected.__name__:
                corrected = Corrected.model_validate_json(item.payload)
                self.corrections.add(1, {"tool": corrected.detail.tool, "outcome": "recovered"})
            elif item.model == EscalationRaise.__name__:
                raised = EscalationRaise.model_validate_json(item.payload)
                if raised.kind == "schema_cap":
                    self.corrections.add(1, {"tool": str(raised.tool), "outcome": "escalated"})
        if state.done:
            self.runs_finished.add(1, {"status": state.status})

    # --- handlers -------------------------------------------------------------------------------
    async def on_submit(self, submit: RunSubmit) -> None:
        """A client's submit (``cmd.run.submit.<tenant>``) or a sub-agent run the planner spawned
        (``cmd.run.spawn``): admitted first (tenant, parent, limits, scenario), then started once."""
        subject = current_subject()
        record: AgentRecord | None = None
        try:
            submit = admit(submit, subject, self.settings)
            if submit.agent is not None:  # a registered agent's run: its definition as of now
                record, _ = await self.bus.kv_get(S.KV_AGENTS, submit.agent, AgentRecord)
                submit = resolve_agent(submit, record, provider_name(self.settings, "planner"))
                check_limits(submit, self.settings)  # the agent's limits are capped like a submit's
        except Refused as err:
            await self.refuse(submit, subject, str(err))
            return
        existing = await self.load(submit.run_id, fresh=True)
        if submit.scenario is not None and not await self.bind_scenario(submit, started=existing is not None):
            return
        if existing is not None:
            await self.publish(existing.outbox.get(ids.SUBMIT, []), submit.run_id)
            return
        if submit.scenario is None:
            await self.unbind_stray_scenario(submit.run_id)
        contracts = await self.contracts()
        lessons: list[str] = []
        if submit.lessons:
            stored, _ = await self.bus.kv_get(S.KV_LESSONS, lessons_key(submit.task), Lessons)
            lessons = stored.reasons if stored else []
        config = with_agent(resolve_config(submit, self.settings, contracts), record)
        out = start_run(submit, config, lessons)
        out.state.agent, out.state.agent_version, out.state.tenant = config.agent, config.agent_version, submit.tenant
        out.state.remember(ids.SUBMIT, out.items)
        out.state.trace_parent = current_traceparent() if self.tracing else ""
        try:
            await self.store.create(out.state)
            self.saved()
        except CasConflict:
            existing = await self.load(submit.run_id, fresh=True)
            if existing is not None:
                await self.publish(existing.outbox.get(ids.SUBMIT, []), submit.run_id)
            return
        await asyncio.gather(self.publish(out.items, submit.run_id), self.store.store_tail(out.state))
        out.state.published(ids.SUBMIT, out.items)

    async def on_outcome(self, outcome: ToolOutcome) -> None:
        if outcome.will_retry:
            return  # a transient failure the executor goes on from: not the call's outcome
        # the run state is a KV value: it keeps a bounded form of a large result, never megabytes
        outcome = bounded_outcome(outcome, self.settings.run_state_result_max_bytes)
        await self.transact(
            outcome.run_id,
            ids.outcome(outcome.iteration, outcome.call_id, unknown=outcome.failure_type == "unknown_outcome"),
            lambda s: apply_outcome(s, outcome),
            take_turn=True,
        )

    async def on_verdict(self, verdict: Verdict) -> None:
        msg_id = ids.verdict(verdict.candidate_id)
        await self.transact(verdict.run_id, msg_id, lambda s: apply_verdict(s, verdict), take_turn=True)

    async def on_resolution(self, res: EscalationResolution) -> None:
        msg_id = ids.resolution(res.escalation_id)
        await self.transact(res.run_id, msg_id, lambda s: apply_resolution(s, res), take_turn=True)

    @staticmethod
    def takes(state: RunState, ev: RunAdvance) -> bool:
        """Whether the run is (still) at the turn ``ev`` asks for."""
        return not state.done and state.iteration.n == ev.iteration and state.status == "running"

    async def on_advance(self, ev: RunAdvance, inline: bool = False) -> None:
        """Take the run's turn ``ev`` names: from the advance consumer, or ``inline`` where the message
        that scheduled it is handled (``transact``)."""
        msg_id = ids.advanced(ev.iteration)
        # A later turn comes through the advance consumer only when a planner of an earlier version
        # re-published the advance of a message whose inline turn may have stored its answer.
        stored = current_deliveries() > 1 or (not inline and ev.iteration > 1)
        state = await self.load(ev.run_id)
        if state is not None and not state.seen(msg_id) and not self.takes(state, ev):
            state = await self.load(ev.run_id, fresh=True)  # what this replica kept may be behind
        if state is None:
            raise TryLater(f"run {ev.run_id} is not stored yet", delay=1.0)
        if state.seen(msg_id):
            await self.publish(state.outbox.get(msg_id, []), ev.run_id)
            return
        if not self.takes(state, ev):
            return  # stale: this iteration already moved on
        contracts = await self.contracts()
        try:
            provider = await run_provider(self.bus, self.settings, "planner", ev.run_id)
        except ProviderError as err:
            reason = str(err)
            await self.transact(ev.run_id, msg_id, lambda s: apply_provider_failure(s, reason))
            return

        try:
            decision, planned = await self.reserve(state, contracts)
        except RequestRefused as err:  # the governor could not read our request: a bug, not a budget
            reason = f"the governor refused the budget request: {err}"
            await self.transact(ev.run_id, msg_id, lambda s: apply_provider_failure(s, reason))
            return
        if decision.action == "block":
            reason = "; ".join(decision.reasons) or "budget exhausted"
            await self.transact(ev.run_id, msg_id, lambda s: apply_guard(s, reason))
            return

        wrap = state.iteration.wrap_up
        if decision.action == "wrap_up" and not wrap:  # the governor: the cost ceiling is near
            wrap = "; ".join(decision.reasons) or "the cost ceiling is near"
            planned = C.wrap_up_request(state, decision.model, decision.max_output_tokens, wrap)
        if wrap:
            await self.wrap_up(state, ev, msg_id, provider, contracts, decision, planned, wrap, stored)
            return

        compaction: tuple[int, str, ModelResponse] | None = None
        if decision.action == "compact":
            compaction = await self.compact(state, provider, decision.model)
            if compaction is not None:
                self.store.forget(ev.run_id)  # changed here for the request only: re-read to apply
                apply_compaction(state, compaction[0], compaction[1], compaction[2].usage)

        try:
            reuse = planned if compaction is None else None  # compaction changed the history
            response, storing = await self.model_call(state, provider, contracts, decision, reuse, stored)
        except StopReasonError as err:  # billed, but no usable turn: a typed end (refusal, cut off, ...)
            stop = err
            self.count_tokens(stop.usage)
            await self.transact(ev.run_id, msg_id, lambda s: apply_model_stop(s, stop.kind, str(stop), stop.usage))
            return
        except ProviderError as err:
            if err.transient:
                raise TryLater(f"model provider still failing after retries: {err}", delay=5.0) from err
            reason = f"model call failed: {err}"
            await self.transact(ev.run_id, msg_id, lambda s: apply_provider_failure(s, reason))
            return
        if any(call.name not in contracts for call in response.tool_calls):
            contracts = await self.contracts(refresh=True)  # a tool may have registered a moment ago
        if unhosted := await self.hosting.unhosted(c.name for c in response.tool_calls if c.name in contracts):
            contracts = {n: c for n, c in contracts.items() if n not in unhosted}  # registered, but no replica runs
        self.count_tokens(response.usage)

        def apply(s: RunState) -> Outbox | None:
            if not on_turn(s, ev.iteration):
                return None
            if compaction is not None:
                apply_compaction(s, compaction[0], compaction[1], compaction[2].usage)
            adopt_model(s, decision.model)
            return apply_model_response(s, response, contracts)

        try:
            await self.transact(ev.run_id, msg_id, apply)
        finally:
            if storing is not None:
                await storing

    async def wrap_up(
        self,
        state: RunState,
        ev: RunAdvance,
        msg_id: str,
        provider: object,
        contracts: dict[str, ToolContract],
        decision: BudgetDecision,
        planned: ModelRequest,
        reason: str,
        stored: bool,
    ) -> None:
        """The run's last turn, without tools; a failed wrap-up call stops the run as the guard would."""
        try:
            response, storing = await self.model_call(state, provider, contracts, decision, planned, stored)
        except ProviderError as err:
            if err.transient:
                raise TryLater(f"model provider still failing after retries: {err}", delay=5.0) from err
            if isinstance(err, StopReasonError):
                self.count_tokens(err.usage)
            why = f"{reason} (the wrap-up turn failed: {err})"
            await self.transact(ev.run_id, msg_id, lambda s: apply_guard(s, why))
            return
        self.count_tokens(response.usage)

        def apply(s: RunState) -> Outbox | None:
            if not on_turn(s, ev.iteration):
                return None
            adopt_model(s, decision.model)
            return apply_wrap_up(s, response, reason)

        try:
            await self.transact(ev.run_id, msg_id, apply)
        finally:
            if storing is not None:
                await storing

    def count_tokens(self, usage: Usage) -> None:
        """The billed cost (the GenAI token histograms are recorded per call; cache parts are span attributes)."""
        if usage.cost_usd:
            self.cost.add(usage.cost_usd)

    # --- I/O helpers ------------------------------------------------------------------------------
    def cached_contracts(self) -> dict[str, ToolContract] | None:
        """The registered tools as last listed, while that listing is fresh (2 s); else None."""
        fetched_at, cached = self._contracts
        return cached if cached and time.monotonic() - fetched_at < CONTRACTS_FRESH_S else None

    async def contracts(self, refresh: bool = False) -> dict[str, ToolContract]:
        """Registered tools (cached for 2 s; ``refresh`` when a call names a tool not in the cache)."""
        cached = self.cached_contracts()
        if not refresh and cached is not None:
            return cached
        # One listing at a time: the many messages in flight when the cache expires share it (each
        # listing is a consumer on the bucket plus a get per contract, not a step's worth of work).
        started = time.monotonic()
        fetch = self._contracts_fetch
        if fetch is None or fetch.done():
            fetch = self._contracts_fetch = asyncio.ensure_future(self._list_contracts())
        found = await asyncio.shield(fetch)
        if refresh and self._contracts[0] < started:  # the shared listing began before this caller asked
            return await self.contracts(refresh=True)
        return found

    async def hosted(self, tool: str) -> bool | None:
        """Whether a running executor replica takes ``tool``'s calls (its durable has a waiting pull request
        or a message in hand); None when the server cannot say now."""
        try:
            info = await self.bus.js.consumer_info(S.STREAM_CMD, S.executor_durable(tool), timeout=2)
        except NotFoundError:
            return False
        except Exception:  # a timeout, a leader election: dispatch as before
            return None
        return bool(info.num_waiting or info.num_ack_pending)

    async def _list_contracts(self) -> dict[str, ToolContract]:
        listed_at = time.monotonic()
        found = {c.name: c for c in (await self.bus.kv_values(S.KV_CONTRACTS, ToolContract)).values()}
        self._contracts = (listed_at, found)
        return found

    async def bind_scenario(self, submit: RunSubmit, started: bool = False) -> bool:
        """Store the submitted scenario for the run, create-only: the planner is its only writer, so a
        scripted run replays what was submitted with it, and nothing changes it afterwards. A scenario
        that does not match its digest, does not parse, or differs from one already bound is refused, and
        so is one for a run already ``started`` without a scenario (a live run is never made scripted)."""
        problem = None
        if submit.scenario_digest != digest_of(submit.scenario):
            problem = "the submitted scenario does not match its scenario_digest"
        else:
            try:
                scenario = parse_scenario(submit.scenario, f"scenario of {submit.run_id}")
            except ScenarioError as err:
                problem = str(err)
            else:
                if started:  # a scripted run's scenario was bound before its state was stored
                    stored, _ = await self.bus.kv_get(S.KV_SCENARIOS, submit.run_id, Scenario)
                else:
                    stored, _, _ = await self.bus.create_or_get(S.KV_SCENARIOS, submit.run_id, scenario)
                if stored is None:
                    problem = f"run {submit.run_id} was started without a scenario"
                elif _scenario_digest(stored) != _scenario_digest(scenario):  # bound before: the same one only
                    problem = f"another scenario is already bound to run {submit.run_id}"
        if problem is None:
            return True
        await self.refuse(submit, current_subject(), problem, ids.refused_scenario(submit.run_id))
        return False

    async def refuse(self, submit: RunSubmit, subject: str, reason: str, msg_id: str | None = None) -> None:
        """A submit the planner does not start: dead-lettered with the reason, nothing stored or published."""
        body = submit.model_dump_json(by_alias=True)
        letter = DeadLetter(service="planner", subject=subject, reason=reason, body=body)
        await self.bus.publish(
            S.dead_letter("planner"), letter, msg_id=msg_id or ids.refused_submit(submit.run_id, digest_of(body))
        )
        log.error("planner: refused the submit of %s: %s", submit.run_id, reason)

    async def unbind_stray_scenario(self, run_id: str) -> None:
        """A run submitted without a scenario is live: a scenario stored under its id by anyone else (an
        admin could) is removed before the run starts, so nothing treats the run as scripted."""
        kv = await self.bus.kv(S.KV_SCENARIOS)
        try:
            stray = await kv.get(run_id)  # read raw: an unreadable one is removed too
        except KeyNotFoundError:
            return
        if stray.value is not None and stray.operation not in ("DEL", "PURGE"):
            await kv.delete(run_id)
            log.warning("planner: removed a scenario stored for live run %s before it started", run_id)

    def prefetch(self, state: RunState, items: list[PublishRecord]) -> None:
        """A transaction just applied a message to ``state`` and is about to save it: when ``items``
        carry the advance to the run's next model turn, that turn's budget request goes out now, so
        the governor's round trip overlaps the save's instead of following it; ``prefetch_saved``
        marks it usable once the save succeeded. Only with the catalogue cached (a listing is not
        worth waiting for here: the turn then simply asks). Not at submit: on several replicas the
        advance may go to another one, which asks itself; a first request the governor refuses then
        stays one refusal (one dead letter), as before."""
        _, advance = without_advance(items)
        if advance is None:
            return
        turn = advance.iteration
        contracts = self.cached_contracts()
        if contracts is None or state.done or state.status != "running" or state.iteration.n != turn:
            return
        req = self.turn_request(state, contracts)
        decision = asyncio.ensure_future(self.ask_budget(C.budget_request(state, req)))
        decision.add_done_callback(_retrieved)
        self.prefetched[state.run_id] = Prefetched(turn, state, contracts, req, decision)
        self.prefetched.move_to_end(state.run_id)
        while len(self.prefetched) > PREFETCHED_MAX:
            self.prefetched.popitem(last=False)

    def prefetch_saved(self, state: RunState) -> None:
        """``state`` is stored: the early ask made from it may serve its turn."""
        early = self.prefetched.get(state.run_id)
        if early is not None and early.state is state:
            early.revision = self.store.revision(state)

    def turn_request(self, state: RunState, contracts: dict[str, ToolContract]) -> ModelRequest:
        return C.model_request(
            state, contracts, state.model, state.config.max_output_tokens, self.settings.progressive_tools_above
        )

    async def ask_budget(self, budget: BudgetRequest) -> BudgetDecision:
        try:
            return await self.bus.request(S.BUDGET_RESERVE, budget, BudgetDecision)
        except (NatsTimeout, NoRespondersError, TimeoutError) as err:
            raise TryLater(f"governor did not answer: {err!r}", delay=1.0) from err

    async def reserve(self, state: RunState, contracts: dict[str, ToolContract]) -> tuple[BudgetDecision, ModelRequest]:
        """The governor's decision for this turn, and the request it was counted on: the one asked
        for when the turn was scheduled if it fits (same state, revision, turn and catalogue),
        else asked now."""
        early = self.prefetched.pop(state.run_id, None)
        if early is not None and early.fits(state, self.store.revision(state), contracts):
            # the early ask is this turn's ask: its failure (no answer, a refusal) is the turn's, as it would be now
            return await early.decision, early.planned
        req = self.turn_request(state, contracts)
        return await self.ask_budget(C.budget_request(state, req)), req

    def policy(self) -> BackoffPolicy:
        s = self.settings
        return BackoffPolicy(
            s.model_retry_attempts, s.model_retry_base_s, s.model_retry_max_s, max_elapsed_s=s.model_timeout_s
        )

    async def model_call(
        self,
        state: RunState,
        provider: object,
        contracts: dict[str, ToolContract],
        decision: BudgetDecision,
        planned: ModelRequest | None = None,
        stored: bool = False,
    ) -> tuple[ModelResponse, asyncio.Task[int] | None]:
        """One model call per (run, iteration): a turn taken again reuses the stored response.
        Only a turn taken again can find one ``stored`` (a redelivery, or an advance an earlier
        version re-published), so a first take does not look. The response is stored while the
        caller saves the run (returned: the task to await)."""
        key = S.kv_key(state.run_id, f"turn{state.iteration.n}")
        if stored:
            cached, _ = await self.bus.kv_get(S.KV_MODEL_CALLS, key, ModelResponse)
            if cached is not None:
                return cached, None
        if planned is not None:  # the request the budget was counted on: not built twice
            req = planned.model_copy(update={"model": decision.model, "max_tokens": decision.max_output_tokens})
        else:
            req = C.model_request(
                state, contracts, decision.model, decision.max_output_tokens, self.settings.progressive_tools_above
            )
        response = await complete_with_retry(
            provider,  # type: ignore[arg-type]
            req,
            self.policy(),
            self.tracer,
            self.gen_ai,
            more_room_tokens=self.settings.more_room_output_tokens,
        )
        storing = asyncio.create_task(self.bus.kv_put(S.KV_MODEL_CALLS, key, response))
        if self.fault == "after_model_answered":
            await storing
            os._exit(70)
        return response, storing

    async def compact(self, state: RunState, provider: object, model: str) -> tuple[int, str, ModelResponse] | None:
        older, _ = C.split_for_compaction(state.messages, state.config.keep_recent_turns)
        if not older:
            return None
        key = S.kv_key(state.run_id, f"compact{state.iteration.n}")
        response, _ = await self.bus.kv_get(S.KV_MODEL_CALLS, key, ModelResponse)
        if response is None:
            req = ModelRequest(
                purpose="summarize",
                model=model,
                run_id=state.run_id,
                seq=state.compactions,
                system="You compress an agent's working history. Keep facts, tool results that matter, decisions "
                "and open questions; drop chatter. Be concise.",
                messages=[ChatMessage.user(f"Task: {state.task}\n\nSummarize this history:\n{C.transcript(older)}")],
                max_tokens=800,
            )
            response = await complete_with_retry(provider, req, self.policy(), self.tracer, self.gen_ai)  # type: ignore[arg-type]
            await self.bus.kv_put(S.KV_MODEL_CALLS, key, response)
        return len(older), response.text, response

    async def record_lessons(self, state: RunState) -> None:
        if not state.judge_failures:
            return

        def merge(stored: Lessons | None) -> tuple[Lessons, None]:
            known = stored.reasons if stored else []
            return Lessons(reasons=list(dict.fromkeys([*known, *state.judge_failures]))[-10:]), None

        await self.bus.update(S.KV_LESSONS, lessons_key(state.task), Lessons, merge)


def _scenario_digest(scenario: Scenario) -> str:
    return digest_of(scenario.model_dump(mode="json", by_alias=True))


def without_advance(items: list[PublishRecord]) -> tuple[list[PublishRecord], RunAdvance | None]:
    """The outbox without the advance to the run's own next turn, and that advance (None: none)."""
    for k, item in enumerate(items):
        if is_own_advance(item):
            return items[:k] + items[k + 1 :], RunAdvance.model_validate_json(item.payload)
    return items, None


def on_turn(s: RunState, iteration: int) -> bool:
    """The run is still running the turn a model answer was for (not a stale or repeated answer)."""
    return s.iteration.n == iteration and not s.done and s.status == "running"


def adopt_model(s: RunState, model: str) -> None:
    """The budget chose this model for the turn: recorded, with a warning when it switched."""
    if model != s.model:
        s.warnings.append(f"budget: switched model {s.model} -> {model}")
        s.model = model
