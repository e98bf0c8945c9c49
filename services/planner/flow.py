"""Admission to the fleet, on every planner replica: the fleet's record (``lw_flow``, key ``fleet``), the waiting
runs' tickets (``LW_FLOW``), the admitter that hands free slots out by weighted fair share (``shared.flow.rules``),
the sweep that mends what a replica that died left behind, and the fleet's view (``loopwarden fleet``).

* Every replica admits; none is needed by the others. A replica coalesces its changes to the record (slots its
  runs gave back, runs it admits, that it is alive) into one compare-and-swap write per round (``_round``), so
  replicas race on one small key, not on every step.
* A waiting run's ticket is taken in two steps, in this order: the run is added to the record's running runs
  (the CAS decides which replica took it), then the tickets taken are removed (a purge of the subject up to the
  last one). A replica that dies between them leaves a ticket whose run is already running: the next round
  removes it and starts nothing. Starting the run (its
  record from ``queued`` to ``running``, under CAS) follows; a replica that dies before that leaves a slot whose
  run is still ``queued``: the sweep starts it after ``LW_FLOW_GRACE_S``.
* A run gives its slot back when it ends or waits for a person (``moved``, after the save that says so); one
  that goes on after a person answered takes one again without queueing. A replica that dies before its write
  leaves the slot held: the sweep reads the run's status and frees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import get_args

from pydantic import ValidationError

from services.planner import ids
from services.planner.flow_reads import FLEET_KEY, FlowReads, ticket_of
from services.planner.state import RunState
from shared import metrics as M
from shared import subjects as S
from shared.bus import Bus, Unchanged, scan_page
from shared.flow import (
    FleetRecord,
    Share,
    Usage,
    admit,
    dequeue,
    drift,
    due,
    enqueue,
    heartbeat,
    hold,
    plan,
    recount,
    release,
    take_at_once,
    verdict,
)
from shared.messages import FINAL_STATUSES, FlowTicket, Quota, Refusal
from shared.settings import Settings
from shared.telemetry import Telemetry
from shared.tenancy import Policy

log = logging.getLogger("loopwarden.planner.flow")
SWEEP_BATCH = 32  # slots a sweep looks at, at most
CANDIDATE_SPARE = 8  # tickets a round reads beyond those it picked (another replica may take some meanwhile)
CANDIDATE_PAGES = 8  # pages of tickets a round reads per (tenant, priority) at most (the next round reads on)


@dataclass(eq=False)
class Op:
    """A change to the record this replica has to make: a slot given back (``ended``: the run is over) or taken
    again (a run that waited for a person goes on); a submit counted against its tenant's quotas (``enqueue``:
    ``decided`` says accepted or refused), or uncounted (``dequeue``); waiting counts set to the tickets'
    (``recount``)."""

    kind: str  # release | hold | enqueue | dequeue | recount
    tenant: str = ""
    run_id: str = ""
    ended: bool = False
    stored_bytes: int = 0
    rate_limited_s: float = 0.0
    priority: int = 0
    policy: Policy | None = None
    outside: Usage | None = None
    counts: dict[tuple[str, int], int] = field(default_factory=dict)
    decided: asyncio.Future[tuple[Refusal | None, bool]] | None = None


@dataclass
class Round:
    """What one round admitted, and which tickets it may delete; what it decided of each submit."""

    decisions: dict[Op, tuple[Refusal | None, bool]] = field(default_factory=dict)  # refused, or started at once
    admitted: list[FlowTicket] = field(default_factory=list)
    waited: dict[str, float] = field(default_factory=dict)
    seqs: dict[str, int] = field(default_factory=dict)  # run id -> its ticket's sequence
    stale_upto: dict[str, int] = field(default_factory=dict)  # subject -> last ticket of a run already admitted
    planned: int = 0
    unfilled: int = 0  # picks no ticket read was left for (another replica took them first): read again
    unread: int = 0  # picks of runs waiting as stored whose tickets were not read (the record had moved on)


class Flow(FlowReads):
    def __init__(
        self, bus: Bus, settings: Settings, telemetry: Telemetry, begin: Callable[[str], Awaitable[str | None]]
    ) -> None:
        super().__init__(bus, settings, telemetry)
        self.begin = begin  # start an admitted run: its status after (None: no record)
        self.replica = f"planner-{uuid.uuid4().hex[:12]}"
        self._ops: list[Op] = []
        self._wake = asyncio.Event()
        self._checked: dict[str, float] = {}
        self._drift: dict[tuple[str, int], int] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._starting: set[asyncio.Task[None]] = set()
        meter = telemetry.meter("loopwarden.planner")
        self.admitted = meter.create_counter(M.FLOW_ADMITTED, description="runs admitted, by tenant")
        self.refused = meter.create_counter(
            M.FLOW_REFUSED, description="submits refused at the door, by tenant and quota"
        )
        self.finished = meter.create_counter(M.FLOW_FINISHED, description="admitted runs that ended")
        self.rate_limited = meter.create_histogram(
            M.FLOW_RATE_LIMITED, unit="s", description="an ended run's time waiting for the providers' rate limits"
        )
        self.waited = meter.create_histogram(
            M.FLOW_WAIT, unit="s", description="time a run waited for its tenant's share of the fleet"
        )
        for quota in (*get_args(Quota), "admission"):  # a refusal's series exist before the first one (dashboards)
            self.refused.add(0, {"tenant": S.DEFAULT_TENANT, "quota": quota})
        bus.on_stop.append(self.stop)

    # --- lifecycle -------------------------------------------------------------------------------------------
    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._admitter(), name="flow admitter"),
            asyncio.create_task(self._sweeper(), name="flow sweep"),
        ]
        self._wake.set()  # runs may be waiting since before this replica started

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # --- what the rest of the planner tells it ---------------------------------------------------------------
    def queued(self) -> None:
        """A ticket was published: a round admits it if there is room."""
        self._wake.set()

    async def enqueue(self, policy: Policy, priority: int, outside: Usage, run_id: str) -> tuple[Refusal | None, bool]:
        """Count a submit of ``policy.tenant`` as waiting, or refuse it by its quotas; when nothing waits and there
        is room, it takes its slot at once (True: start it now). Decided in this replica's next write of the record,
        with whatever else is due then."""
        op = Op("enqueue", policy.tenant, run_id=run_id, priority=priority, policy=policy, outside=outside)
        op.decided = asyncio.get_running_loop().create_future()
        self._ops.append(op)
        self._wake.set()
        return await op.decided

    def release_now(self, tenant: str, run_id: str) -> None:
        """A run that took its slot at once and did not start after all (its run id was taken)."""
        self._ops.append(Op("release", tenant, run_id))
        self._wake.set()

    def dequeue(self, tenant: str, priority: int) -> None:
        """A submit counted as waiting that will not wait after all (its run id was taken)."""
        self._ops.append(Op("dequeue", tenant, priority=priority))
        self._wake.set()

    def moved(self, state: RunState, before: str) -> None:
        """``state`` was saved with a new status (``before``: the one it had): a run that ended or waits for a
        person gives its slot back; one that goes on after a person answered takes one again. A sub-agent holds
        none (its parent does)."""
        after = state.status
        if after == before or state.config.parent_run_id:
            return
        tenant = state.tenant or S.DEFAULT_TENANT
        if after in FINAL_STATUSES or after == "awaiting_human":
            ended = after in FINAL_STATUSES
            self._ops.append(
                Op(
                    "release",
                    tenant,
                    state.run_id,
                    ended=ended,
                    stored_bytes=stored_bytes(state),
                    rate_limited_s=state.rate_limited_s,
                )
            )
        elif before == "awaiting_human" and after == "running":
            self._ops.append(Op("hold", tenant, state.run_id))
        else:
            return
        self._wake.set()

    # --- the admitter ----------------------------------------------------------------------------------------
    async def _admitter(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                more = await self._round()
            except Exception as err:
                log.warning("flow: a round failed (tried again): %r", err)
                self._kept = None
                await asyncio.sleep(0.2 + random.random() * 0.3)
                more = True
            if more:
                self._wake.set()

    async def _round(self) -> bool:
        """One write of the record: this replica's slot changes, the submits it counts, its heartbeat, and as many
        admissions as there are free slots and tickets; then the admitted runs' tickets are deleted and the runs
        started. True when another round may admit more."""
        ops, self._ops = self._ops, []
        try:
            record = self._kept[0] if self._kept is not None else await self._read_record()
            now = time.time()
            draft = record.copy_to_change()
            for op in ops:
                apply_op(draft, op, now)
            policies = {t: await self.policies.of(t) for t in {*draft.queued, *draft.running}}
            picks = self._plan(draft, policies, now)
            # a (tenant, priority) with no run waiting before this round's submits has no ticket to read (a ticket is
            # published after the write that counts its run): a submit that starts at the door reads none
            candidates = await self._candidates([p for p in picks if record.queued_by(p[0]).get(p[1])], draft)
            result = Round()

            def change(stored: FleetRecord | None) -> tuple[FleetRecord, Round] | Unchanged[Round]:
                nonlocal result
                result = Round(planned=len(picks))
                rec = stored.copy_to_change() if stored is not None else FleetRecord()
                changed = heartbeat(rec, self.replica, now, self.ttl)
                capacity = self.capacity(rec, now)
                others = {t: policies.get(t) or self.settings.tenant_policy(t) for t in {*rec.queued, *rec.running}}
                for op in ops:
                    if op.kind == "enqueue":
                        assert op.policy is not None and op.outside is not None
                        refused = enqueue(rec, op.policy, op.priority, op.outside)
                        at_once = refused is None and take_at_once(
                            rec, op.policy, op.priority, op.run_id, capacity, now,
                            others=others, headroom=int(capacity * self.settings.flow_headroom),
                        )  # fmt: skip
                        result.decisions[op] = (refused, at_once)
                        changed = changed or refused is None
                    else:
                        changed = apply_op(rec, op, now) or changed
                taken: set[str] = set()
                pool = {k: list(v) for k, v in candidates.items()}  # called again after a conflict: from the start
                for tenant, priority in self._plan(rec, policies, now):  # the rules again, on the record as stored
                    ticket = next_ticket(pool.get((tenant, priority), []), rec, taken, result)
                    if ticket is None:
                        result.unfilled += 1
                        before = stored.queued_by(tenant) if stored is not None else {}
                        if (tenant, priority) not in pool and before.get(priority):
                            result.unread += 1  # runs wait there as stored, unseen by this replica: read next round
                        continue
                    waited = max(0.0, now - ticket[0].queued_at.timestamp())
                    admit(rec, tenant, ticket[0].run_id, now, waited_s=waited, priority=priority)
                    result.admitted.append(ticket[0])
                    result.waited[ticket[0].run_id] = waited
                    result.seqs[ticket[0].run_id] = ticket[1]
                    changed = True
                return (rec, result) if changed else Unchanged(result)

            result = await self.bus.update(
                S.KV_FLOW, FLEET_KEY, FleetRecord, change, known=self._kept, saved=self._keep
            )
        except BaseException:
            self._ops[:0] = ops  # not written: the next round writes them
            raise
        stored = self._kept[0] if self._kept is not None else None
        for op in ops:
            if op.kind == "release" and op.ended:
                self.finished.add(1, {"tenant": self.tenant_label(op.tenant)})
                self.rate_limited.record(op.rate_limited_s, {"tenant": self.tenant_label(op.tenant)})
            if op.decided is not None and not op.decided.done():
                op.decided.set_result(result.decisions.get(op, (None, False)))
                if result.decisions.get(op, (None, False))[1]:  # admitted at once: it waited for nothing
                    self.admitted.add(1, {"tenant": self.tenant_label(op.tenant)})
                    self.waited.record(0.0, {"tenant": self.tenant_label(op.tenant)})
                if stored is not None and op.policy is not None and op.outside is not None:
                    self.note_usage(op.policy, stored, op.outside)
        await self._take(result)
        for ticket in result.admitted:
            self.admitted.add(1, {"tenant": self.tenant_label(ticket.tenant)})
            self.waited.record(result.waited[ticket.run_id], {"tenant": self.tenant_label(ticket.tenant)})
            self._start(ticket.run_id, ticket.tenant)
        more = bool(result.admitted) and (len(result.admitted) >= result.planned > 0 or result.unfilled > 0)
        return more or result.unread > 0

    def _plan(self, record: FleetRecord, policies: dict[str, Policy], now: float) -> list[tuple[str, int]]:
        """Who the free slots (and the headroom for tenants below their share) go to, by the rules."""
        shares = []
        for tenant in {*record.queued, *record.running}:
            policy = policies.get(tenant) or self.settings.tenant_policy(tenant)
            shares.append(
                Share(
                    tenant=tenant,
                    weight=policy.weight,
                    cap=policy.max_running,
                    running=record.running_of(tenant),
                    queued=record.queued_by(tenant),
                )
            )
        capacity = self.capacity(record, now)
        headroom = int(capacity * self.settings.flow_headroom)
        return plan(shares, capacity, limit=capacity + headroom, headroom=headroom)

    async def _candidates(
        self, picks: list[tuple[str, int]], record: FleetRecord
    ) -> dict[tuple[str, int], list[tuple[FlowTicket, int]]]:
        """The oldest tickets of each (tenant, priority) picked: as many as picked whose runs are not in flight, plus
        a few (another replica may admit some before this round's write), and the tickets before them of runs
        already admitted (not deleted yet: ``next_ticket`` skips them, ``_take`` removes them). Read page by page,
        only as far as needed: a ticket read is a message the server sends and this replica parses."""
        wanted: dict[tuple[str, int], int] = {}
        for pick in picks:
            wanted[pick] = wanted.get(pick, 0) + 1
        found: dict[tuple[str, int], list[tuple[FlowTicket, int]]] = {}
        for (tenant, priority), n in wanted.items():
            found[(tenant, priority)] = await self.waiting_tickets(
                S.flow_ticket(tenant, priority), n + CANDIDATE_SPARE, record
            )
        return found

    async def waiting_tickets(self, subject: str, n: int, record: FleetRecord) -> list[tuple[FlowTicket, int]]:
        """The oldest tickets on ``subject`` up to the ``n``-th whose run is not in flight (``record``)."""
        out: list[tuple[FlowTicket, int]] = []
        fresh, start = 0, 1
        for _ in range(CANDIDATE_PAGES):
            msgs, pending = await scan_page(self.bus.nc, S.STREAM_FLOW, subject, start, batch=n - fresh)
            for ticket in (ticket_of(m) for m in msgs):
                if ticket is not None:
                    out.append(ticket)
                    fresh += record.tenant_of(ticket[0].run_id) is None
            if fresh >= n or not msgs or not pending:
                break
            start = msgs[-1].seq + 1
        return out

    async def _take(self, result: Round) -> None:
        """Remove the tickets this round admitted (and those of runs admitted before whose tickets were left):
        per (tenant, priority), every ticket up to the last one taken, in one purge. Every older ticket on that
        subject is of a run in flight (tickets are taken oldest first, and a newer one never comes before), so
        nothing waiting is removed; a purge that fails leaves tickets a later round finds admitted and removes."""
        upto: dict[str, int] = {}
        for ticket in result.admitted:
            subject = S.flow_ticket(ticket.tenant, ticket.priority)
            upto[subject] = max(upto.get(subject, 0), result.seqs[ticket.run_id])
        for subject, seq in result.stale_upto.items():
            upto[subject] = max(upto.get(subject, 0), seq)
        await asyncio.gather(*(self._purge(subject, seq) for subject, seq in upto.items()))

    async def _purge(self, subject: str, seq: int) -> None:
        try:
            await self.bus.nc.request(
                f"$JS.API.STREAM.PURGE.{S.STREAM_FLOW}", json.dumps({"filter": subject, "seq": seq + 1}).encode(), 5
            )
        except Exception as err:  # left: the next round finds their runs admitted and removes them
            log.warning("flow: tickets on %s up to %d not removed: %r", subject, seq, err)

    def _start(self, run_id: str, tenant: str) -> None:
        async def start() -> None:
            try:
                status = await self.begin(run_id)
            except Exception as err:  # the sweep starts it after the grace
                log.warning("flow: run %s admitted but not started: %r", run_id, err)
                return
            if status is not None and status != "running":  # not queued any more, and not running: no slot
                self._ops.append(Op("release", tenant, run_id, ended=False))
                self._wake.set()

        task = asyncio.create_task(start(), name=f"flow start {run_id}")
        self._starting.add(task)
        task.add_done_callback(self._starting.discard)

    # --- the sweep -------------------------------------------------------------------------------------------
    async def _sweeper(self) -> None:
        while True:
            await asyncio.sleep(self.settings.flow_sweep_s * random.uniform(0.8, 1.2))
            try:
                await self.sweep()
            except Exception as err:
                log.warning("flow: sweep failed: %r", err)

    async def sweep(self) -> None:
        """Say this replica is alive, admit what a lost wake-up left waiting, and look at a few slots: a run that
        ended, waits for a person or is gone gives its slot back; one admitted but never started is started."""
        record = await self._records.get()
        now = time.time()
        running = {run: at for runs in record.running.values() for run, at in runs.items()}
        tenants = {run: t for t, runs in record.running.items() for run in runs}
        every = max(5 * self.settings.flow_sweep_s, self.settings.flow_grace_s)
        for run_id in due(
            running, self._checked, now, grace=self.settings.flow_grace_s, every=every, batch=SWEEP_BATCH
        ):
            self._checked[run_id] = now
            try:
                state, _ = await self.bus.kv_get(S.KV_RUNS, run_id, RunState)
            except ValidationError:
                state = None
            status = state.status if state is not None else None
            check = verdict(status)
            if check == "keep" and state is not None and state.outbox.get(ids.ADMITTED):
                check = "start"  # started, but what its start produced may not be published (its starter died)
            match check:
                case "release":
                    log.info("flow: sweep frees the slot of %s (%s)", run_id, status or "no record")
                    self._ops.append(Op("release", tenants[run_id], run_id, ended=status in FINAL_STATUSES))
                case "start":
                    log.warning(
                        "flow: sweep starts %s, admitted %.0fs ago and still queued", run_id, now - running[run_id]
                    )
                    self._start(run_id, tenants[run_id])
                case "keep":
                    pass
        for gone in [r for r in self._checked if r not in running]:
            del self._checked[gone]
        # the waiting counts against the tickets: a difference seen twice in a row is not a submit in flight
        differs = drift(record, await self._read_counts())
        lasting = {k: n for k, n in differs.items() if self._drift.get(k) == n}
        self._drift = differs
        if lasting:
            log.warning("flow: waiting counts set to the tickets there are: %s", lasting)
            self._ops.append(Op("recount", counts=lasting))
        self._wake.set()


# --- helpers (pure) --------------------------------------------------------------------------------------------
def apply_op(record: FleetRecord, op: Op, now: float) -> bool:
    """``op`` applied to ``record`` (an ``enqueue`` as if accepted: a draft's; the write decides it again)."""
    match op.kind:
        case "hold":
            return hold(record, op.tenant, op.run_id, now)
        case "release":
            return release(
                record, op.run_id, now, ended=op.ended, stored_bytes=op.stored_bytes, rate_limited_s=op.rate_limited_s
            )
        case "enqueue":  # as if accepted, waiting (a draft's: the write decides it again)
            assert op.policy is not None and op.outside is not None
            return enqueue(record, op.policy, op.priority, op.outside) is None
        case "dequeue":
            return dequeue(record, op.tenant, op.priority)
        case "recount":
            return recount(record, op.counts)
    raise ValueError(op.kind)


def next_ticket(
    candidates: list[tuple[FlowTicket, int]], record: FleetRecord, taken: set[str], result: Round
) -> tuple[FlowTicket, int] | None:
    """The oldest candidate not admitted yet (one whose run is already in flight is a ticket to delete)."""
    while candidates:
        ticket, seq = candidates.pop(0)
        if ticket.run_id in taken:
            continue
        taken.add(ticket.run_id)
        if record.tenant_of(ticket.run_id) is not None:
            subject = S.flow_ticket(ticket.tenant, ticket.priority)
            result.stale_upto[subject] = max(result.stale_upto.get(subject, 0), seq)
            continue
        return ticket, seq
    return None


def stored_bytes(state: RunState) -> int:
    """What a run that ended keeps stored, at least: every message it published (its events and commands carry
    what its conversation repeats: the model's turns, the tool results)."""
    return state.published_bytes
