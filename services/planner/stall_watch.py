"""The planner's watch over runs that stopped moving: thin handlers over ``stalls.py`` (the rules).

* ``planner_letters`` (on ``LW_DLQ``): every dead letter, any service's. One that held up a run marks it
  ``stalled`` with a queue item (``stalls.held_up_by``); a submit refused before a run started becomes a
  ``refused`` record, so its submitter hears it.
* ``planner_handled`` (on ``LW_EVT``, ``evt.letter.handled.<run>``): a letter handed back was handled; the run
  moves on (``stalls.letter_handled``).
* a sweep every ``LW_STALL_SWEEP_S``: when the replica registry (``lw_replicas``) shows a service with no live
  replica, the runs that have waited on it for ``LW_STALL_AFTER_S`` are marked stalled
  (``stalls.missing_replica``); their next step ends it. It reads the runs only while something is missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from pydantic import ValidationError

from services.planner import ids, stalls
from services.planner.state import RunState
from services.planner.transaction import Change
from services.planner.turns import resolve_config
from shared import subjects as S
from shared.bus import Bus, CasConflict, current_seq, kv_scan
from shared.dead_letters import refusal, run_of, submitted_run
from shared.messages import FINAL_STATUSES, DeadLetter, LetterHandled, RunSubmit, utcnow
from shared.payloads import PayloadError
from shared.replica_registry import live_replicas
from shared.replicas import Fleet

if TYPE_CHECKING:
    from services.planner.handlers import Planner

log = logging.getLogger("loopwarden.planner")
# What runs wait on (``stalls.needs``) besides the executors: asked by request, or pulled from a durable.
ASKED = ("governor", "escalation")
PULLED = (("validator", S.DURABLE_VALIDATOR), ("judge", S.DURABLE_JUDGE))


class StallWatch:
    def __init__(self, planner: Planner) -> None:
        self.planner = planner
        self.bus: Bus = planner.bus
        self.settings = planner.settings
        self._sweeper: asyncio.Task[None] | None = None

    def register(self) -> None:
        self.bus.consumer(
            durable=S.DURABLE_PLANNER_LETTERS,
            stream=S.STREAM_DLQ,
            filter_subjects=[f"{S.DLQ_PREFIX}.>"],
            model=DeadLetter,
        )(self.on_letter)
        self.bus.consumer(
            durable=S.DURABLE_PLANNER_HANDLED,
            stream=S.STREAM_EVT,
            filter_subjects=[S.any_run(S.LETTER_HANDLED)],
            model=LetterHandled,
        )(self.on_handled)

    # --- dead letters --------------------------------------------------------------------------------------
    async def on_letter(self, letter: DeadLetter) -> None:
        seq = current_seq()
        if not seq:
            return
        submitted = submitted_run(letter)
        if submitted is not None:
            await self.refuse(letter, *submitted)
            return
        run_id = run_of(letter)
        if run_id is None:
            return  # a request's, a requeue's, a letter's: no run waits on it
        state = await self.planner.store.load(run_id, fresh=True)
        if state is None or state.done or await self.handed_back(letter.service, seq):
            return
        to = letter.requeue_to if refusal(seq, letter) is None else None
        now = utcnow()
        await self.planner.transact(
            run_id, ids.letter(seq), lambda s: stalls.held_up_by(s, seq, letter, requeue_to=to, now=now)
        )
        log.warning("planner: run %s is stalled on dead letter %d (%s)", run_id, seq, letter.reason[:200])

    async def handed_back(self, service: str, seq: int) -> bool:
        """Whether letter ``seq`` was handed back already (``lw_requeues``): it was handled, or fails again as a
        later letter that names it."""
        kv = await self.bus.kv(S.KV_REQUEUES)
        with contextlib.suppress(Exception):
            entry = await kv.get(S.kv_key(service, str(seq)))
            return entry.value is not None
        return False

    async def on_handled(self, handled: LetterHandled) -> None:
        if handled.run_id is None:
            return
        state = await self.planner.store.load(handled.run_id, fresh=True)
        if state is None or state.stall is None or handled.letter not in state.stall.letters:
            return
        await self.planner.transact(
            handled.run_id, ids.letter_handled(handled.letter), lambda s: stalls.letter_handled(s, handled)
        )

    async def refuse(self, letter: DeadLetter, run_id: str, tenant: str) -> None:
        """A submit the bus (or the planner's intake) refused: the run's record says ``refused`` with the reason,
        once; a run stored under that id already is left as it is."""
        existing = await self.planner.store.load(run_id, fresh=True)
        if existing is not None:
            if existing.status == "refused":  # stored before a crash: its final event goes out (again)
                await self.planner.publish(existing.outbox.get(ids.REFUSED, []), run_id, existing.tenant)
            return
        try:
            submit = RunSubmit(run_id=run_id, task=stalls.submitted_task(letter), tenant=tenant)
        except ValidationError:  # a tenant token that is not a name: no one's to tell
            return
        config = resolve_config(submit, self.settings, {})
        out = stalls.refused(run_id, tenant, submit.task, letter.reason, config)
        try:
            await self.planner.store.create(out.state)
        except CasConflict:
            return
        await self.planner.publish(out.items, run_id, tenant)
        self.planner.runs.finished("refused", tenant, None, seconds=0.0, cost_usd=0.0, input_tokens=0, output_tokens=0)
        log.warning("planner: submit of %s refused before it started: %s", run_id, letter.reason[:200])

    # --- runs waiting on a service with no live replica -------------------------------------------------------
    def start(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="stall sweep")
        self.bus.on_stop.append(self.stop)

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._sweeper

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.stall_sweep_s)
            try:
                await self.sweep()
            except Exception:  # a bad moment (a reconnect) must not end the sweeper
                log.exception("planner: stall sweep failed")

    async def sweep(self) -> int:
        """Mark the runs that wait on a service with no live replica; returns how many were marked."""
        fleet = Fleet.of(await live_replicas(self.bus))
        if not await self.something_missing(fleet):
            return 0
        now = utcnow()
        stale = now - timedelta(seconds=self.settings.stall_after_s)
        found, _ = await kv_scan(self.bus.nc, S.KV_RUNS)
        marked = 0
        for run_id, stored in found.items():
            if stored is None or (stored.time is not None and stored.time > stale):
                continue  # moved within the bound (a record is rewritten at every step)
            state = await self._state(run_id, stored.data)
            if state is None:
                continue
            need = stalls.first_missing(stalls.needs(state), fleet)
            if need is None or (state.stall is not None and state.stall.missing == need.label):
                continue
            try:
                await self.planner.transact(run_id, ids.missing_replica(state.events_published), self._mark(need, now))
            except Exception as err:  # one run that cannot be marked now (gone, contended): the next sweep
                log.warning("planner: run %s not marked stalled now: %r", run_id, err)
                continue
            marked += 1
            log.warning("planner: run %s is stalled: no live %s replica", run_id, need.label)
        return marked

    def _mark(self, need: stalls.Need, now: datetime) -> Change:
        after = self.settings.stall_after_s
        return lambda s: stalls.missing_replica(s, need, now=now, after_s=after)

    async def something_missing(self, fleet: Fleet) -> bool:
        """Whether a service runs may wait on has no live replica while work waits for it: the governor or the
        queue (asked, not pulled: no live replica is enough), the validator or the judge with messages in their
        durable, an executor hosting a tool whose calls wait in its durable."""
        if any(not fleet.serves(service) for service in ASKED):
            return True
        durables = [(s, d) for s, d in PULLED if not fleet.serves(s)]
        durables += [
            ("executor", S.executor_durable(tool))
            for tool in await self.planner.contracts()
            if not fleet.serves("executor", S.executor_durable(tool))
        ]
        for _, durable in durables:
            with contextlib.suppress(Exception):
                info = await self.bus.js.consumer_info(S.STREAM_CMD, durable, timeout=2)
                if info.num_pending or info.num_ack_pending:
                    return True
        return False

    async def _state(self, run_id: str, data: bytes) -> RunState | None:
        """A run's record as scanned, if it is not over (a finished run's is skipped unparsed)."""
        try:
            value = await self.bus.payloads.inflate_value(self.bus.nc, data, self.settings.value_limit(S.KV_RUNS))
            if json.loads(value).get("status") in FINAL_STATUSES:
                return None
            return RunState.model_validate_json(value)
        except (ValueError, PayloadError, AttributeError) as err:
            log.warning("planner: %s/%s cannot be read in the stall sweep: %s", S.KV_RUNS, run_id, err)
            return None
