"""A run's model turn, taken: its budget (asked early, while the step that scheduled it is saved),
the model call (once per turn: a turn taken again reuses the stored answer), compaction and the
wrap-up turn. What the turn decided comes back as a ``turns.TurnResult`` for the handler's transaction to
apply (``turns.apply_turn``); this module neither applies nor publishes it."""

from __future__ import annotations

import asyncio
import os
from collections import OrderedDict
from dataclasses import dataclass

from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from opentelemetry.trace import Tracer

from services.planner import context as C
from services.planner.catalogue import Catalogue
from services.planner.hosting import Hosting
from services.planner.leases import Leases
from services.planner.state import PublishRecord, RunState
from services.planner.store import RunStore
from services.planner.transaction import scheduled_turn
from services.planner.turns import (
    Answered,
    Blocked,
    Compaction,
    ProviderFailed,
    Sent,
    Stopped,
    TurnResult,
    WrappedUp,
    apply_compaction,
)
from shared import subjects as S
from shared.aio import retrieved
from shared.backoff import BackoffPolicy
from shared.bus import Bus, RequestRefused, TryLater
from shared.messages import BudgetDecision, BudgetRequest, ChatMessage, RunAdvance, ToolContract, Usage
from shared.metrics import Tally
from shared.providers.base import ModelRequest, ModelResponse, ProviderError, StopReasonError, complete_with_retry
from shared.providers.select import run_provider
from shared.ratelimit.gate import Gate, Purpose, RateLimiter, RateLimitWait, shown_on
from shared.settings import Settings
from shared.telemetry import GenAiMetrics

PREFETCHED_MAX = 1024  # runs whose next turn's decision a replica holds at once


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
    asked: BudgetRequest
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


@dataclass
class Taken:
    """What a turn decided, for the transaction to apply (``turns.apply_turn``); ``storing``: the
    model's answer being stored (await it once the result is saved)."""

    result: TurnResult
    storing: asyncio.Task[int] | None = None


class ModelTurns:
    def __init__(
        self,
        bus: Bus,
        settings: Settings,
        store: RunStore,
        catalogue: Catalogue,
        tracer: Tracer,
        gen_ai: GenAiMetrics,
        cost: Tally,
        limiter: RateLimiter,
        leased: Tally | None = None,
    ) -> None:
        self.bus, self.settings, self.store, self.catalogue = bus, settings, store, catalogue
        self.tracer, self.gen_ai, self.cost = tracer, gen_ai, cost
        self.limiter = limiter  # the providers' rate limits, shared by every replica (lw_ratelimits)
        # a called tool no running executor replica hosts (through the grace): unknown_tool
        self.hosting = Hosting(catalogue.hosted, grace_s=settings.tool_host_grace_s)
        self.prefetched: OrderedDict[str, Prefetched] = OrderedDict()  # per run: its next turn's budget decision
        self.leases = Leases()  # per run: the turns its last decision allows without asking (``leases.py``)
        self.leased = leased  # turns taken on a lease (loopwarden.budget.leased_turns)
        self.fault = settings.fault_inject  # TEST ONLY (tests/test_inline_turns.py)

    def request(
        self,
        state: RunState,
        contracts: dict[str, ToolContract],
        model: str,
        max_tokens: int,
        wrap_up: str | None = None,
    ) -> ModelRequest:
        """The turn's request to the model (``context.model_request``; the wrap-up variant with ``wrap_up``)."""
        return C.model_request(state, contracts, model, max_tokens, self.settings.progressive_tools_above, wrap_up)

    async def take(self, state: RunState, ev: RunAdvance, stored: bool) -> Taken:
        """Take the turn ``ev`` names on ``state`` (the run is at it): the budget, then the model call
        (or the wrap-up, or a typed end), returned as what the turn decided. ``stored``: the turn may
        have been taken before, and its answer stored."""
        contracts = await self.catalogue.contracts()
        try:
            provider = await run_provider(self.bus, self.settings, "planner", ev.run_id)
            decision, planned = await self.reserve(state, contracts)
        except RequestRefused as err:  # the governor could not read our request: a bug, not a budget
            return Taken(ProviderFailed(f"the governor refused the budget request: {err}"))
        except ProviderError as err:
            return Taken(ProviderFailed(str(err)))
        if decision.action == "block":
            return Taken(Blocked("; ".join(decision.reasons) or "budget exhausted"))
        wrap = state.iteration.wrap_up
        if decision.action == "wrap_up" and not wrap:  # the governor: the cost ceiling is near
            wrap = "; ".join(decision.reasons) or "the cost ceiling is near"
            planned = self.request(state, contracts, decision.model, decision.max_output_tokens, wrap_up=wrap)
        compaction = None
        if not wrap and decision.action == "compact":
            try:
                compaction = await self.compact(state, provider, decision.model)
            except RateLimitWait as err:  # waited past the bound: a typed end, not a redelivery
                return Taken(ProviderFailed(f"compaction failed: {err}"))
            if compaction is not None:
                self.store.forget(ev.run_id)  # changed here for the request only: re-read to apply
                apply_compaction(state, compaction.older_count, compaction.summary, compaction.usage)
                # the budget was counted on the history before; the call sends the compacted one
                planned = self.request(state, contracts, decision.model, decision.max_output_tokens)
        try:
            response, storing = await self.model_call(state, provider, decision, planned, stored)
        except ProviderError as err:
            if err.transient:
                raise TryLater(f"model provider still failing after retries: {err}", delay=5.0) from err
            if isinstance(err, StopReasonError):  # billed, but no usable turn
                self.count_cost(err.usage)
                if not wrap:  # a typed end (refusal, cut off, ...)
                    return Taken(Stopped(err.kind, str(err), err.usage))
            if wrap:  # a failed wrap-up call stops the run as the guard would
                return Taken(Blocked(f"{wrap} (the wrap-up turn failed: {err})"))
            return Taken(ProviderFailed(f"model call failed: {err}"))
        self.count_cost(response.usage)
        self.leases.called(ev.run_id, ev.iteration, response.usage)  # a turn taken on a lease: reported next ask
        if wrap:  # the run's last turn, without tools
            return Taken(WrappedUp(ev.iteration, decision.model, response, wrap, Sent.of(planned)), storing)
        if any(call.name not in contracts for call in response.tool_calls):
            contracts = await self.catalogue.contracts(refresh=True)  # a tool may have registered a moment ago
        if unhosted := await self.hosting.unhosted(c.name for c in response.tool_calls if c.name in contracts):
            contracts = {n: c for n, c in contracts.items() if n not in unhosted}  # registered, but no replica runs
        return Taken(Answered(ev.iteration, decision.model, response, contracts, compaction, Sent.of(planned)), storing)

    def count_cost(self, usage: Usage) -> None:
        """The billed cost (the GenAI token histograms are recorded per call; cache parts are span attributes)."""
        if usage.cost_usd:
            self.cost.add(usage.cost_usd)

    # --- the budget, asked early -------------------------------------------------------------------
    def prefetch(self, state: RunState, items: list[PublishRecord]) -> None:
        """A transaction just applied a message to ``state`` and is about to save it: when ``items``
        carry the advance to the run's next model turn, that turn's budget request goes out now, so
        the governor's round trip overlaps the save's instead of following it; ``prefetch_saved``
        marks it usable once the save succeeded. Only with the catalogue cached (a listing is not
        worth waiting for here: the turn then simply asks). Not at submit: on several replicas the
        advance may go to another one, which asks itself; a first request the governor refuses then
        stays one refusal (one dead letter), as before."""
        _, advance = scheduled_turn(items)
        if advance is None:
            return
        turn = advance.iteration
        contracts = self.catalogue.cached()
        if contracts is None or state.done or state.status != "running" or state.iteration.n != turn:
            return
        req = self.request(state, contracts, state.model, state.config.max_output_tokens)
        budget = C.budget_request(state, req)
        if self.leases.covers(budget):
            return  # the turn is on the run's lease: nothing to ask (``reserve`` finds it so again)
        decision = asyncio.ensure_future(self.ask_budget(self.leases.asking(budget)))
        decision.add_done_callback(retrieved)
        self.prefetched[state.run_id] = Prefetched(turn, state, contracts, req, budget, decision)
        self.prefetched.move_to_end(state.run_id)
        while len(self.prefetched) > PREFETCHED_MAX:
            self.prefetched.popitem(last=False)

    def prefetch_saved(self, state: RunState) -> None:
        """``state`` is stored: the early ask made from it may serve its turn."""
        early = self.prefetched.get(state.run_id)
        if early is not None and early.state is state:
            early.revision = self.store.revision(state)

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
            decision = await early.decision
            self.leases.decided(early.asked, decision)
            return decision, early.planned
        req = self.request(state, contracts, state.model, state.config.max_output_tokens)
        budget = C.budget_request(state, req)
        leased = self.leases.allow(budget)
        if leased is not None:  # the run's last decision allows this turn as it is: no round trip to the governor
            if self.leased is not None:
                self.leased.add(1)
            return leased, req
        decision = await self.ask_budget(self.leases.asking(budget))
        self.leases.decided(budget, decision)
        return decision, req

    # --- the model ---------------------------------------------------------------------------------
    def policy(self) -> BackoffPolicy:
        s = self.settings
        return BackoffPolicy(
            s.model_retry_attempts, s.model_retry_base_s, s.model_retry_max_s, max_elapsed_s=s.model_timeout_s
        )

    async def model_call(
        self, state: RunState, provider: object, decision: BudgetDecision, planned: ModelRequest, stored: bool = False
    ) -> tuple[ModelResponse, asyncio.Task[int] | None]:
        """One model call per (run, iteration): a turn taken again reuses the stored response.
        Only a turn taken again can find one ``stored`` (a redelivery, or an advance an earlier
        version re-published), so a first take does not look. ``planned``: the request the budget
        was counted on, sent with the model and reply size the budget chose. The response is stored
        while the caller saves the run (returned: the task to await)."""
        key = S.kv_key(state.run_id, f"turn{state.iteration.n}")
        if stored:
            cached, _ = await self.bus.kv_get(S.KV_MODEL_CALLS, key, ModelResponse)
            if cached is not None:
                return cached, None
        req = planned.model_copy(update={"model": decision.model, "max_tokens": decision.max_output_tokens})
        gate = self.gate(state, provider, "plan")
        response = await complete_with_retry(
            provider,  # type: ignore[arg-type]
            req,
            self.policy(),
            self.tracer,
            self.gen_ai,
            more_room_tokens=self.settings.more_room_output_tokens,
            gate=gate,
        )
        if gate is not None and gate.waited_s:
            response = response.model_copy(update={"rate_limit_wait_s": round(gate.waited_s, 3)})
        storing = asyncio.create_task(self.bus.kv_put(S.KV_MODEL_CALLS, key, response))
        if self.fault == "after_model_answered":
            await storing
            os._exit(70)
        return response, storing

    async def compact(self, state: RunState, provider: object, model: str) -> Compaction | None:
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
            gate = self.gate(state, provider, "summarize")
            response = await complete_with_retry(provider, req, self.policy(), self.tracer, self.gen_ai, gate=gate)  # type: ignore[arg-type]
            await self.bus.kv_put(S.KV_MODEL_CALLS, key, response)
        return Compaction(len(older), response.text, response.usage)

    # --- the provider's rate limit -----------------------------------------------------------------
    def gate(self, state: RunState, provider: object, purpose: Purpose) -> Gate | None:
        """The turn's passage through its provider key's rate limit, shown on the run while it waits."""
        bound = state.config.max_rate_limit_wait_s or self.settings.rate_limit_max_wait_s
        show = shown_on(self.bus, state.run_id, lambda: state.iteration.n)
        return self.limiter.gate(provider, purpose=purpose, max_wait_s=bound, notice=show)
