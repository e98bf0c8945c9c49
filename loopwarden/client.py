"""The client API: submit runs, watch them, read their history, work the escalation queue.

The CLI and the tests use it; it speaks the same contracts as the services.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from opentelemetry.trace import SpanKind

from loopwarden.stack import StackError, recorded_nats_url
from shared import history as H
from shared import subjects as S
from shared.agents import load_agent, next_record
from shared.bus import RUN_ID_HEADER, Bus, CasConflict, Stored, kv_scan, scan_all
from shared.canonical import digest_of
from shared.dead_letters import NotRequeueable, not_ours, requeue_command, requeue_msg_id, superseded
from shared.messages import (
    FINAL_STATUSES,
    PROGRESS_EVENTS,
    Agent,
    AgentRecord,
    ChatMessage,
    Corrected,
    DeadLetter,
    EscalationAction,
    EscalationClaim,
    EscalationQuery,
    EscalationReply,
    EscalationResolve,
    RunLimits,
    RunRead,
    RunReadReply,
    RunSnapshot,
    RunSubmit,
    ToolAttempt,
    ToolOutcome,
    call_attempts,
    utcnow,
)
from shared.payloads import PayloadError
from shared.scenario import Outcome, Scenario
from shared.settings import Settings
from shared.telemetry import LW_RUN_ID, Telemetry, setup_telemetry
from shared.urls import redact_url

TENANT_POLL_S = 0.2  # how often a tenant-bound client asks again (it reads no live event)
PROGRESS_STEMS = frozenset(S.run_event(e.model_fields["kind"].default) for e in PROGRESS_EVENTS)


def new_run_id() -> str:
    return f"run-{uuid.uuid4().hex[:20]}"


@dataclass
class Event:
    """One entry of a run's history, whatever its contract."""

    subject: str
    payload: dict[str, Any]
    run_id: str
    headers: dict[str, str] = field(default_factory=dict)  # as published (``traceparent``: the run's trace)
    seq: int = 0  # its sequence in the stream it was read from

    @property
    def kind(self) -> str:
        return S.stem(self.subject).removeprefix(f"{S.P}.evt.")


@dataclass(frozen=True)
class NumberedLetter:
    """A dead letter and its number: its sequence in LW_DLQ, which ``Client.requeue`` takes."""

    seq: int
    letter: DeadLetter


@dataclass(frozen=True)
class Requeued:
    """A letter handed back to its service; ``duplicate``: it had been handed back already within the
    de-duplication window (``LW_DUPLICATE_WINDOW_S``), so the server kept the first one only."""

    seq: int
    service: str
    subject: str
    duplicate: bool


class Watch:
    """A run's live events (``Client.watch``): iterate it; ``close`` (or leave its ``async with``) unsubscribes."""

    def __init__(self, run_id: str, event: Callable[[Any], Awaitable[Event]]) -> None:
        self.run_id = run_id
        self.event = event  # a received message as an Event (``Client.event``)
        self.subs: list[Any] = []
        self._queue: asyncio.Queue[Event] = asyncio.Queue()

    async def on_msg(self, msg: Any) -> None:
        if (msg.headers or {}).get(RUN_ID_HEADER, "") == self.run_id:
            await self._queue.put(await self.event(msg))

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> Event:
        return await self._queue.get()

    async def next(self, timeout: float | None = None) -> Event | None:
        """The next event, or None after ``timeout`` seconds."""
        try:
            async with asyncio.timeout(timeout):
                return await self._queue.get()
        except TimeoutError:
            return None

    async def close(self) -> None:
        subs, self.subs = self.subs, []
        for sub in subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def __aenter__(self) -> Watch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class UnknownAgent(LookupError):
    """A run of an agent that is not registered (``loopwarden agents list`` shows those that are)."""


class NotAllowed(PermissionError):
    """The server did not let this client's NATS user do it (registering agents is for operators)."""


@dataclass(frozen=True)
class RunResult:
    """How a run ended (or stands, when it waits for a human): what ``Client.run`` returns."""

    run_id: str
    status: str  # completed, stopped, failed, or awaiting_human (a person decides: ``escalation_id``)
    final_output: str | None
    reason: str | None  # why it ended, in one line (``final_reason``)
    cost_usd: float
    agent: str | None = None
    agent_version: int | None = None
    passed: bool | None = None  # the judge's verdict on the final answer (None: not judged)
    escalation_id: str | None = None
    snapshot: RunSnapshot | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, snap: RunSnapshot) -> RunResult:
        return cls(
            run_id=snap.run_id,
            status=snap.status,
            final_output=snap.final_output,
            reason=snap.final_reason,
            cost_usd=snap.usage.cost_usd,
            agent=snap.agent,
            agent_version=snap.agent_version,
            passed=snap.passed,
            escalation_id=snap.awaiting.escalation_id if snap.awaiting else None,
            snapshot=snap,
        )


def select_runs(
    runs: list[RunSnapshot],
    *,
    status: str | None = None,
    agent: str | None = None,
    tenant: str | None = None,
    since: timedelta | None = None,
    limit: int | None = None,
    offset: int = 0,
    now: datetime | None = None,
) -> list[RunSnapshot]:
    """The runs that match every filter given, newest first (by creation), ``offset`` skipped, at most
    ``limit``. ``since``: created at most that long before ``now``."""
    after = (now or utcnow()) - since if since is not None else None
    picked = [
        r
        for r in runs
        if (status is None or r.status == status)
        and (agent is None or r.agent == agent)
        and (tenant is None or r.tenant == tenant)
        and (after is None or r.created_at >= after)
    ]
    picked.sort(key=lambda r: (r.created_at, r.run_id), reverse=True)
    return picked[offset : None if limit is None else offset + limit]


class Unreachable(ConnectionError):
    """The client could not connect: nothing answers at the URL, the server refused the credentials, or
    JetStream was not ready in time. The message names the URL (never a password) and where it came from."""

    def __init__(self, message: str, url: str) -> None:
        super().__init__(message)
        self.url = url  # as shown: without its password


def resolve_settings(settings: Settings | None = None) -> tuple[Settings, str]:
    """The settings pointed at a server the way the CLI finds one: the URL given (``Settings(nats_url=...)``,
    ``LW_NATS_URL``/``NATS_URL``), else the stack ``loopwarden up`` recorded, else the default; and where
    the URL came from (for errors)."""
    settings = settings if settings is not None else Settings()
    if "nats_url" in settings.model_fields_set:
        return settings, ""
    try:
        recorded = recorded_nats_url(settings.state_dir)
    except StackError as err:
        raise Unreachable(str(err), redact_url(settings.nats_url)) from None
    if recorded is None:
        return settings, " (the default: LW_NATS_URL/NATS_URL is not set and `loopwarden up` recorded no stack)"
    url, path = recorded
    return settings.model_copy(update={"nats_url": url}), f" (the stack `loopwarden up` recorded in {path})"


async def probe(settings: Settings, timeout: float, origin: str = "") -> None:
    """One bounded connect: the server answers at ``settings.nats_url`` within ``timeout`` seconds, or
    :class:`Unreachable` naming the URL (``origin``: where it came from)."""
    import nats
    from nats.errors import Error as NatsError

    servers = [u.strip() for u in settings.nats_url.split(",")]
    password = settings.nats_password.get_secret_value() if settings.nats_password else None
    seen: list[Exception] = []

    async def remember(err: Exception) -> None:
        seen.append(err)

    try:
        async with asyncio.timeout(timeout + 1):
            # nats-py drops a server from its pool only after max_reconnect_attempts (> 0) failures
            nc = await nats.connect(
                servers,
                connect_timeout=timeout,
                allow_reconnect=False,
                max_reconnect_attempts=1,
                reconnect_time_wait=0.1,
                user=settings.nats_user,
                password=password,
                error_cb=remember,
            )
    except (OSError, TimeoutError, NatsError) as err:
        last = seen[-1] if seen else err
        why = (str(last) or type(last).__name__).replace(password or "\0", "***")
        url = redact_url(settings.nats_url)
        raise Unreachable(
            f"cannot reach NATS at {url}{origin} ({why}); is the stack up? `loopwarden up` starts one, "
            "LW_NATS_URL/NATS_URL picks another",
            url,
        ) from None
    await nc.close()


READY_TIMEOUT_S = 30.0  # JetStream answers within it, or it will not (the streams are created here)


class Client:
    """A connection to a running Loopwarden stack: submit runs and wait for them, read and watch their
    events, work the escalation queue.

    ``async with Client() as client: ...`` finds the server as the ``loopwarden`` CLI does (``settings``'
    URL, else ``LW_NATS_URL``/``NATS_URL``, else the stack ``loopwarden up`` recorded, else the default) and
    connects within ``connect_timeout`` seconds (default ``LW_CLI_CONNECT_TIMEOUT_S``, 3) or raises
    :class:`Unreachable` naming the URL. ``ready_timeout`` bounds the wait for JetStream's streams once the
    server answers; by default 30 s, and no limit on a managed cluster (``LW_MANAGE_STREAMS=false``), where
    a client started before ``loopwarden bootstrap`` waits for it as the services do (logged, naming what is
    missing). Once connected, a lost server is reconnected to without limit."""

    def __init__(
        self,
        settings: Settings | None = None,
        telemetry: Telemetry | None = None,
        identity: str = "client",  # the NATS user this client is (an operator's name, "console", ...): its inbox
        *,
        connect_timeout: float | None = None,
        ready_timeout: float | None = None,
    ) -> None:
        self.settings, self._origin = resolve_settings(settings)
        self.identity = identity
        self.connect_timeout = connect_timeout if connect_timeout is not None else self.settings.cli_connect_timeout_s
        self.ready_timeout = (
            READY_TIMEOUT_S if ready_timeout is None and self.settings.manage_streams else ready_timeout
        )
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._run_events: dict[str, list[Any]] = {}  # run id -> subscriptions to its run events
        self.telemetry: Telemetry | None = telemetry or setup_telemetry(self.identity, self.settings)
        self.bus = Bus(self.settings, self.identity, self.telemetry.bus_tracer_provider)

    async def connect(self) -> Client:
        """Connect (bounded, see the class) and make sure the streams this client reads exist."""
        await probe(self.settings, self.connect_timeout, self._origin)
        try:
            async with asyncio.timeout(self.ready_timeout):
                await self.bus.connect()
        except TimeoutError:
            with contextlib.suppress(Exception):
                await self.bus.broker.stop()
            url = redact_url(self.settings.nats_url)
            raise Unreachable(
                f"NATS at {url}{self._origin} answered but JetStream was not ready in {self.ready_timeout:.0f}s", url
            ) from None
        return self

    async def close(self) -> None:
        """Disconnect (and flush this client's spans)."""
        await self.bus.broker.stop()
        if self.telemetry is not None:
            self.telemetry.tracer_provider.force_flush()

    async def __aenter__(self) -> Client:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- runs ------------------------------------------------------------------------------------
    async def submit_scenario(
        self, scenario: Scenario, run_id: str | None = None, limits: RunLimits | None = None
    ) -> str:
        """Submit a scenario's task with the scenario bound to it (replayed by scripted providers).

        The scenario travels in the submit message (by reference when large) with its digest; only the
        planner stores it, so no client can write another run's scenario."""
        run_id = run_id or new_run_id()
        data = scenario.model_dump(mode="json", by_alias=True)
        submit = RunSubmit(
            run_id=run_id,
            task=scenario.task,
            rubric=scenario.effective_rubric(),
            limits=limits or scenario.limits or RunLimits(),
            answer_mode=scenario.answer_mode,
            terminal_tools=scenario.terminal_tools,
            tools=scenario.allowed_tools,
            lessons=scenario.lessons,
            scenario=data,
            scenario_digest=digest_of(data),
        )
        await self.submit(submit)
        return run_id

    # --- agents ----------------------------------------------------------------------------------
    async def register(self, agent: Agent | str | Path, timeout: float = 10.0) -> AgentRecord:
        """Register ``agent`` (an ``Agent``, or a YAML/JSON file of one) under its name: the stored record,
        with its version (one more than the last when the definition changed, the same when it did not).
        Only operators and the admin may (``NotAllowed`` otherwise): an agent is what every tenant's runs
        of it do. Raises ``AgentError`` for a file that is not a valid agent."""
        agent = agent if isinstance(agent, Agent) else load_agent(agent)
        try:
            async with asyncio.timeout(timeout):
                while True:
                    stored, revision = await self.bus.kv_get(S.KV_AGENTS, agent.name, AgentRecord)
                    record = next_record(stored, agent)
                    if record is None:
                        assert stored is not None
                        return stored
                    try:
                        await self.bus.kv_put(S.KV_AGENTS, agent.name, record, revision=revision)
                    except CasConflict:  # registered meanwhile: on top of that one
                        continue
                    return record
        except TimeoutError:
            user = self.settings.nats_user or "(no user)"
            raise NotAllowed(
                f"agent {agent.name!r} was not registered in {timeout:.0f}s: NATS user {user} may not write "
                f"{S.KV_AGENTS} (only operators and the admin register agents)"
            ) from None

    async def agent(self, name: str) -> AgentRecord | None:
        """The registered agent of that name (its definition, version and digest), or None."""
        record, _ = await self.bus.kv_get(S.KV_AGENTS, name, AgentRecord)
        return record

    async def agents(self) -> list[AgentRecord]:
        """Every registered agent, by name."""
        return sorted(
            [AgentRecord.model_validate_json(v) for v in await self._values(S.KV_AGENTS)],
            key=lambda r: r.agent.name,
        )

    async def _values(self, bucket: str) -> list[bytes]:
        """Every current value of a bucket, by batched direct gets (no consumer: clients may create none)."""
        await self.bus.kv(bucket)
        found, _ = await kv_scan(self.bus.nc, bucket)
        return [await self.bus.payloads.inflate_value(self.bus.nc, m.data) for m in found.values() if m and m.data]

    async def submit_agent(
        self,
        agent: str,
        task: str | None = None,
        *,
        scenario: Scenario | None = None,
        run_id: str | None = None,
    ) -> str:
        """Start a run of the registered ``agent`` on ``task`` (live), or scripted by ``scenario`` (its task
        unless ``task`` is given): the run id. ``UnknownAgent`` when no agent has that name (a tenant's client,
        which may not read the agents, learns it from the planner's dead letter instead: the run never starts)."""
        if not self.tenant_bound and await self.agent(agent) is None:
            raise UnknownAgent(f"agent {agent!r} is not registered (`loopwarden agents list` shows those that are)")
        if task is None and scenario is None:
            raise ValueError("a run needs a task (or a scenario, whose task it takes)")
        data = scenario.model_dump(mode="json", by_alias=True) if scenario is not None else None
        submit = RunSubmit(
            run_id=run_id or new_run_id(),
            task=task if task is not None else scenario.task,  # type: ignore[union-attr]
            agent=agent,
            scenario=data,
            scenario_digest=digest_of(data) if data is not None else None,
        )
        return await self.submit(submit)

    async def run(
        self,
        agent: str,
        task: str | None = None,
        *,
        scenario: Scenario | None = None,
        run_id: str | None = None,
        timeout: float = 120.0,
    ) -> RunResult:
        """Run the registered ``agent`` on ``task`` and wait until the run ends or waits for a human:

            result = await client.run("restock", task="What should we reorder?")
            print(result.status, result.final_output, result.cost_usd)

        A scripted run: ``scenario=load_scenario(FILE)``. ``TimeoutError`` (naming the run) past
        ``timeout`` seconds; ``UnknownAgent`` when no agent has that name."""
        run_id = await self.submit_agent(agent, task, scenario=scenario, run_id=run_id)
        snap = await self.wait(run_id, timeout=timeout, until=(*FINAL_STATUSES, "awaiting_human"), history=False)
        return RunResult.of(snap)

    async def runs(
        self,
        *,
        status: str | None = None,
        agent: str | None = None,
        tenant: str | None = None,
        since: timedelta | None = None,
        limit: int | None = 50,
        offset: int = 0,
    ) -> list[RunSnapshot]:
        """The runs the planner keeps (``lw_runs``), newest first, filtered (see ``select_runs``)."""
        snaps = []
        for value in await self._values(S.KV_RUNS):
            with contextlib.suppress(ValueError):  # a record this version cannot read is left out
                snaps.append(RunSnapshot.model_validate_json(value))
        return select_runs(snaps, status=status, agent=agent, tenant=tenant, since=since, limit=limit, offset=offset)

    async def submit(self, submit: RunSubmit) -> str:
        assert self.telemetry is not None
        tracer = self.telemetry.tracer("loopwarden.client")
        # The root of the run's trace: every service's spans hang below it.
        with tracer.start_as_current_span(
            f"run {submit.run_id}", kind=SpanKind.PRODUCER, attributes={LW_RUN_ID: submit.run_id}
        ):
            # on its tenant's subject: the server lets this client's user publish only its own tenant's
            subject = S.run_submit(submit.tenant or self.bus.settings.tenant)
            await self.bus.publish(subject, submit, msg_id=f"submit.{submit.run_id}")
        return submit.run_id

    @property
    def tenant_bound(self) -> bool:
        """A client of a tenant other than the default reads its runs through the planner (``rpc.runs``,
        its own tenant's runs only): its user may read no bucket or stream of runs, which hold every
        tenant's. The default tenant's ``client`` (a single-tenant deployment's) reads them directly."""
        return self.settings.tenant != S.DEFAULT_TENANT

    async def _read(self, verb: str, read: RunRead) -> RunReadReply:
        return await self.bus.request(S.run_read(verb, self.settings.tenant), read, RunReadReply)

    async def _value(self, value: Any) -> bytes:
        """A value a ``RunReadReply`` carries, its body fetched when it travelled by reference."""
        return await self.bus.payloads.inflate_value(self.bus.nc, json.dumps(value).encode())

    async def state(self, run_id: str, history: bool = False) -> RunSnapshot | None:
        """The run as the planner publishes it (``RunSnapshot``); with ``history``, its
        ``messages`` are read too (from ``lw_history`` and the record's tail)."""
        if self.tenant_bound:
            reply = await self._read("state", RunRead(run_id=run_id))
            snap = RunSnapshot.model_validate_json(await self._value(reply.record)) if reply.found else None
        else:
            snap, _ = await self.bus.kv_get(S.KV_RUNS, run_id, RunSnapshot)
        if snap is not None and history:
            snap.messages = await self.history(snap)
        return snap

    async def history(self, run: str | RunSnapshot, last: int | None = None) -> list[ChatMessage]:
        """The run's live conversation (or its ``last`` messages), oldest first."""
        if not self.tenant_bound:
            snap = run if isinstance(run, RunSnapshot) else await self.state(run)
            return [] if snap is None else await H.messages(self.bus, snap, last)
        if isinstance(run, RunSnapshot):  # the messages that snapshot names
            start = run.history_start if last is None else max(run.history_start, run.history_len - last)
            read = RunRead(run_id=run.run_id, start=start, end=run.history_len)
        else:
            read = RunRead(run_id=run, last=last)
        out: list[ChatMessage] = []
        while True:  # in pages that each fit in one message
            reply = await self._read("history", read)
            if not reply.found:
                return out
            out += [ChatMessage.model_validate_json(await self._value(i.body)) for i in reply.items]
            if reply.next is None:
                return out
            read = RunRead(run_id=read.run_id, start=reply.next, end=reply.end)

    async def wait(
        self,
        run_id: str,
        timeout: float = 60.0,
        until: tuple[str, ...] = FINAL_STATUSES,
        history: bool = True,
    ) -> RunSnapshot:
        """The run's snapshot once its status is in ``until`` (with its ``messages`` unless
        ``history`` is false). Reacts to the run's own events (a subscription to that run's subjects,
        shared by waits on it) instead of polling; the state is read again only when one of the
        run's events that can change its status arrives (not on a step's progress events, see
        ``PROGRESS_EVENTS``), and once a second as a safety net. A run that waits for a human is
        returned once its queue item is there (``show(state.awaiting.escalation_id)`` has it)."""
        deadline = time.monotonic() + timeout
        changed = await self._on_run_events(run_id)
        poll = TENANT_POLL_S if self.tenant_bound else 1.0  # a tenant-bound client has no live events: it asks
        state = None
        try:
            while time.monotonic() < deadline:
                changed.clear()
                try:
                    state = await self.state(run_id)
                except TimeoutError:  # the server did not answer in time (an overloaded machine): ask again
                    continue
                if state is not None and state.status in until:
                    if state.done:
                        await self._settled(run_id, state.status, deadline, changed)
                    elif state.awaiting is not None and not self.tenant_bound:  # its user does not read the queue
                        await self._filed(state.awaiting.escalation_id, deadline)
                    if history:
                        state.messages = await self.history(state)
                    return state
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0.01, min(poll, deadline - time.monotonic()))):
                        await changed.wait()
        finally:
            await self._stop_waiting(run_id, changed)
        raise TimeoutError(
            f"run {run_id} did not reach {until} in {timeout:.0f}s (last status: "
            f"{state.status if state else 'not stored'})"
        )

    async def _on_run_events(self, run_id: str) -> asyncio.Event:
        """An event set whenever one of the run's events is published: the server sends this
        client that run's ``evt.run.*`` events only (``S.run_filters``), not every run's."""
        changed = asyncio.Event()
        self._waiters.setdefault(run_id, set()).add(changed)
        if run_id not in self._run_events and not self.tenant_bound:  # its user reads no live event
            subs = self._run_events[run_id] = []

            async def dispatch(msg: Any) -> None:
                if msg.subject.rsplit(".", 1)[0] in PROGRESS_STEMS:
                    return  # a step's progress: the status is unchanged, nothing to read again
                for waiter in self._waiters.get(run_id, ()):
                    waiter.set()

            for subject in S.run_filters(run_id, f"{S.RUN_EVENT_PREFIX}.>"):
                subs.append(await self.bus.nc.subscribe(subject, cb=dispatch))
        return changed

    async def _stop_waiting(self, run_id: str, changed: asyncio.Event) -> None:
        waiters = self._waiters.get(run_id)
        if waiters is None:
            return
        waiters.discard(changed)
        if not waiters:
            del self._waiters[run_id]
            for sub in self._run_events.pop(run_id, []):
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()

    async def _filed(self, escalation_id: str, deadline: float) -> None:
        """Wait until the queue has the item a waiting run names: the escalation service files it a moment
        after the planner's state says the run waits, and whoever was told "waits for a human" looks it up next."""
        from nats.errors import NoRespondersError

        while time.monotonic() < deadline:
            try:
                if (await self.show(escalation_id)).ok:
                    return
            except NoRespondersError:
                return  # no queue to ask (a stack run without the escalation service): nothing to wait for
            await asyncio.sleep(0.05)

    async def _settled(self, run_id: str, status: str, deadline: float, changed: asyncio.Event) -> None:
        """Wait until the run's final event is in the stream. The planner saves the state, then
        publishes; the final event is published last, so once it is there, the history is whole."""
        while time.monotonic() < deadline:
            if await self.events(run_id, subjects=S.run_event(status), timeout=0.2):
                return
            changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.2):
                    await changed.wait()

    async def events(
        self, run_id: str | None = None, subjects: str = f"{S.P}.evt.>", timeout: float = 2.0
    ) -> list[Event]:
        """The stored event history (optionally of one run), oldest first. ``subjects`` is a stem or
        stem pattern. One run's history is a server-side filter on the run's subject token
        (``S.run_filters``): the server sends that run's events only, whatever else is stored. Read by
        batched direct gets (``shared.bus.scan``): a reader creates no consumer on the stream. A tenant-bound
        client reads one run's events at a time, through the planner (``rpc.runs.events``), in pages."""
        if self.tenant_bound:
            return await self._run_events_read(run_id, subjects)
        stream = S.stream_for(subjects) or S.STREAM_EVT
        filters = S.run_filters(run_id, subjects) if run_id is not None and stream == S.STREAM_EVT else [subjects]
        nc = self.bus.nc
        # a stream electing a new leader (a node died) answers nothing for a few seconds: read again
        stored = await self.bus.through_failover(
            f"read {subjects}", lambda: scan_all(nc, stream, filters, timeout=max(timeout, 1.0)), repeatable=True
        )
        out: list[Event] = []
        for m in stored:
            if run_id is None or m.headers.get(RUN_ID_HEADER, "") == run_id:
                out.append(await self.event(m))
        return out

    async def _run_events_read(self, run_id: str | None, subjects: str, start: int = 1) -> list[Event]:
        if run_id is None:
            raise ValueError("a client bound to a tenant reads one run's events at a time (name the run)")
        out: list[Event] = []
        read: int | None = start
        while read is not None:
            reply = await self._read("events", RunRead(run_id=run_id, start=read, subjects=subjects))
            if not reply.found:
                break
            for i in reply.items:
                out.append(await self.event(Stored(i.subject, i.seq, None, i.headers, json.dumps(i.body).encode())))
            read = reply.next
        return out

    async def event(self, msg: Any) -> Event:
        """A received or stored event message as an ``Event``, its body fetched when it travelled by reference
        (a large tool result: ``shared/payloads.py``); a reference that cannot be had stays as it is."""
        headers = dict(msg.headers or {})
        data = msg.data
        with contextlib.suppress(PayloadError):
            data = await self.bus.payloads.inflate(self.bus.nc, data, headers)
        seq = getattr(msg, "seq", 0) if isinstance(msg, Stored) else 0  # a core NATS message (``watch``): none
        return Event(msg.subject, _json(data), headers.get(RUN_ID_HEADER, ""), headers, seq)

    async def watch(self, run_id: str) -> Watch:
        """Live events of a run as they are published. Subscribed when this returns (the server has
        the subscription: flushed), so a run submitted after it misses nothing:
        ``async with await client.watch(run_id) as events: ... async for e in events``."""
        watch = Watch(run_id, self.event)
        if self.tenant_bound:  # its user reads no live event: the run's stored events, asked for as they come
            watch.subs = [_Polled(asyncio.create_task(self._poll_events(watch)))]
            return watch
        nc = self.bus.broker.connection
        watch.subs = [await nc.subscribe(subject, cb=watch.on_msg) for subject in S.run_filters(run_id)]
        await nc.flush()
        return watch

    async def _poll_events(self, watch: Watch) -> None:
        after = (await self._run_events_read(watch.run_id, f"{S.P}.evt.>"))[-1:]  # from now on, as a watch does
        start = after[0].seq + 1 if after else 1
        while True:
            await asyncio.sleep(TENANT_POLL_S)
            with contextlib.suppress(TimeoutError):
                for event in await self._run_events_read(watch.run_id, f"{S.P}.evt.>", start):
                    await watch._queue.put(event)
                    start = event.seq + 1

    async def dead_letters(self) -> list[DeadLetter]:
        return [n.letter for n in await self.letters()]

    async def letters(self) -> list[NumberedLetter]:
        """Every dead letter with its number, oldest first."""
        events = await self.events(subjects=f"{S.DLQ_PREFIX}.>")
        return [NumberedLetter(e.seq, DeadLetter.model_validate(e.payload)) for e in events]

    async def requeueable(self, seq: int) -> DeadLetter:
        """Dead letter ``seq`` if it can be handed back; else ``NoSuchLetter``, or ``NotRequeueable`` naming
        why (a request/reply letter: its caller is gone; a letter that failed again as a later one)."""
        stored_on, letter = await self.bus.read_letter(seq)
        why = not_ours(seq, stored_on, letter, letter.service) or superseded(
            seq, [(n.seq, n.letter) for n in await self.letters() if n.seq > seq]
        )
        if why is not None:
            raise NotRequeueable(why)
        return letter

    async def requeue(self, seq: int, letter: DeadLetter | None = None) -> Requeued:
        """Hand dead letter ``seq`` back to the service that gave up on it: that service runs it through
        the consumer that takes its subject, as a redelivery (its handlers are idempotent), and nothing is
        published on the message's own subject again (an event stays once in the runs' history). A second
        requeue of the same letter within the de-duplication window is dropped by the server (``duplicate``).
        ``letter``: what ``requeueable(seq)`` returned (else it is asked here)."""
        if letter is None:
            letter = await self.requeueable(seq)
        assert letter.requeue_to is not None  # ``refusal`` refuses a letter without one
        ack = await self.bus.publish(
            letter.requeue_to,
            requeue_command(seq),
            msg_id=requeue_msg_id(seq),
            run_id=letter.headers.get(RUN_ID_HEADER),
            traceparent=letter.headers.get("traceparent"),
        )
        return Requeued(seq, letter.service, letter.subject, ack.duplicate)

    # --- escalations ------------------------------------------------------------------------------
    # Who claims, renews or resolves is the operator token of the subject (``...claim.<who>``, or
    # ``...claim.console.<who>`` when the console acts for them): with per-operator NATS users the
    # server lets only that operator publish there, so ``who`` must be the user this client is.
    async def escalations(
        self,
        status: str = "open",
        run_id: str | None = None,
        *,
        kind: str | None = None,
        tool: str | None = None,
        older_than_s: float | None = None,
        newer_than_s: float | None = None,
    ) -> EscalationReply:
        """The queue's items (``.escalations``, newest first): ``status`` open (default), claimed, resolved or
        all; optionally of one run, of one ``kind`` (schema_cap, fatal, ...), for one ``tool``, or by age."""
        return await self.bus.request(
            S.ESCALATION_LIST,
            EscalationQuery(
                status=status,
                run_id=run_id,
                kind=kind,
                tool=tool,
                older_than_s=older_than_s,
                newer_than_s=newer_than_s,
            ),
            EscalationReply,
        )

    async def show(self, escalation_id: str) -> EscalationReply:
        """One item (``.escalations[0]``) with its context: arguments, last turns, allowed actions."""
        return await self.bus.request(S.ESCALATION_SHOW, EscalationQuery(escalation_id=escalation_id), EscalationReply)

    async def claim(self, escalation_id: str, who: str, via: str | None = None) -> EscalationReply:
        """Claim an item for ``who`` under a lease (``.ok`` false and ``.error`` say why not)."""
        return await self.bus.request(
            S.escalation_rpc("claim", who, via), EscalationClaim(escalation_id=escalation_id), EscalationReply
        )

    async def renew(self, escalation_id: str, who: str, via: str | None = None) -> EscalationReply:
        """Extend ``who``'s lease on an item they claimed."""
        return await self.bus.request(
            S.escalation_rpc("renew", who, via), EscalationClaim(escalation_id=escalation_id), EscalationReply
        )

    async def resolve(
        self,
        escalation_id: str,
        who: str,
        action: EscalationAction,
        note: str = "",
        result: Any = None,
        via: str | None = None,
    ) -> EscalationReply:
        """Resolve an item with one of the actions its kind allows (resume, abort, provide_result with
        ``result`` checked against the tool's output contract, retry, final_answer, ...); the run goes on at once.
        An unclaimed item is claimed for ``who`` first."""
        return await self.bus.request(
            S.escalation_rpc("resolve", who, via),
            EscalationResolve(escalation_id=escalation_id, action=action, note=note, result=result),
            EscalationReply,
        )

    async def run_scenario(
        self, scenario: Scenario, *, timeout: float = 120.0, limits: RunLimits | None = None
    ) -> RunSnapshot:
        """Submit ``scenario`` and wait until the run ends or waits for a human (``awaiting_human``: see
        ``escalations``), at most ``timeout`` seconds (else ``TimeoutError`` naming the run). The snapshot
        has its ``run_id``, ``status``, ``final_output``, ``final_reason``, ``usage`` and ``messages``; a run
        waiting for a human has ``awaiting.escalation_id``, an item already in the queue (``show`` has it)."""
        run_id = await self.submit_scenario(scenario, limits=limits)
        return await self.wait(run_id, timeout=timeout, until=(*FINAL_STATUSES, "awaiting_human"))

    async def run_and_check(self, scenario: Scenario, timeout: float = 120.0) -> tuple[RunSnapshot, list[str]]:
        """Run a scenario to its end (or to a human, if that is what it expects) and compare with ``expect``."""
        run_id = await self.submit_scenario(scenario)
        expect = scenario.expect
        ended: tuple[str, ...] = FINAL_STATUSES
        until = (*ended, "awaiting_human") if expect is not None and expect.status == "awaiting_human" else ended
        state = await self.wait(run_id, timeout=timeout, until=until)
        return state, await self.check(scenario, state)

    async def check(self, scenario: Scenario, state: RunSnapshot) -> list[str]:
        """How the run in ``state`` differs from what ``scenario.expect`` says, one line each (none: as expected,
        or no ``expect``)."""
        expect = scenario.expect
        if expect is None:
            return []
        run_id = state.run_id
        escalations: list[Any] = []
        deadline = time.monotonic() + 10
        while True:  # queue items are created by the escalation service a moment after the state says so
            escalations = (await self.escalations(status="all", run_id=run_id)).escalations
            if expect.escalations is None or len(escalations) >= expect.escalations or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        # every call's final outcome, from the run's events (read again for up to 2 s while a stated count
        # differs: the planner publishes a call's last events with the state that ends the run)
        outcomes = tool_outcomes(await self.events(run_id))
        late = time.monotonic() + 2
        while expect.tool_mismatches(outcomes) and time.monotonic() < late:
            await asyncio.sleep(0.1)
            outcomes = tool_outcomes(await self.events(run_id))
        return expect.mismatches(
            Outcome(
                status=state.status,
                final_output=state.final_output,
                escalations=len(escalations),
                escalation_kinds=[e.kind for e in escalations],
                passed=state.passed,
                first_draft_passed=state.first_draft_passed,
                submitted=state.submitted,
                model_calls=state.model_calls,
                judge_calls=state.judge_seq,
                retries=state.retry_count,
                continues=state.continue_count,
                tool_outcomes=outcomes,
                escalation_actions=[e.resolution.action for e in escalations if e.resolution is not None],
            )
        )

    # --- tool metrics (derived from the event history) -------------------------------------------
    async def tool_metrics(self) -> dict[str, dict[str, float]]:
        return tool_metrics(await self.events())


@dataclass(frozen=True)
class _Polled:
    """A tenant-bound client's watch: the task that asks for the run's new events (``close`` ends it)."""

    task: asyncio.Task[None]

    async def unsubscribe(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.task


def _json(data: bytes) -> dict[str, Any]:
    import json

    try:
        value = json.loads(data)
    except ValueError:
        return {"raw": data.decode(errors="replace")}
    return value if isinstance(value, dict) else {"value": value}


def tool_outcomes(events: list[Event]) -> dict[str, dict[str, int]]:
    """Per tool the model called: how many calls ended each way (``succeeded`` or a failure type), from
    the final outcomes in a run's events (an attempt the executor retried is not an outcome)."""
    out: dict[str, dict[str, int]] = {}
    for e in events:
        succeeded = e.subject.startswith(S.TOOL_SUCCEEDED_PREFIX)
        if not (succeeded or e.subject.startswith(S.FAILURE_PREFIX)) or "attempt_id" not in e.payload:
            continue  # not a tool call's outcome (a loop, budget or judge failure)
        try:
            o = ToolOutcome.model_validate(e.payload)
        except ValueError:
            continue
        if o.will_retry:
            continue
        kind = "succeeded" if o.success else str(o.failure_type)
        row = out.setdefault(o.requested_tool, {})
        row[kind] = row.get(kind, 0) + 1
    return out


def tool_metrics(events: list[Event]) -> dict[str, dict[str, float]]:
    """Per tool: parse success rate, validation pass rate, repair rate, correction success rate."""
    counts: dict[str, dict[str, int]] = {}

    def c(tool: str) -> dict[str, int]:
        return counts.setdefault(
            tool,
            {
                "outputs": 0,
                "parsed": 0,
                "valid_first": 0,
                "repaired": 0,
                "schema_failures": 0,
                "recovered": 0,
                "attempts": 0,
                "retried": 0,
            },
        )

    calls: dict[str, list[Any]] = {}  # per attempt id: [tool, its attempt events, its final outcome's attempts]

    def call(attempt_id: str, tool: str) -> list[Any]:
        return calls.setdefault(attempt_id, [tool, 0, 0])

    for e in events:
        if e.subject.startswith(S.TOOL_SUCCEEDED_PREFIX) or e.subject.startswith(f"{S.FAILURE_PREFIX}.output_invalid"):
            o = ToolOutcome.model_validate(e.payload)
            row = c(o.tool)
            row["outputs"] += 1
            row["parsed"] += int(o.parsed)
            row["valid_first"] += int(o.success and not o.repaired)
            row["repaired"] += int(o.repaired)
        if e.subject.startswith(f"{S.FAILURE_PREFIX}.input_invalid") or e.subject.startswith(
            f"{S.FAILURE_PREFIX}.output_invalid"
        ):
            c(ToolOutcome.model_validate(e.payload).requested_tool)["schema_failures"] += 1
        if S.stem(e.subject) == S.run_event("corrected"):  # a streak of schema failures the model fixed
            corrected = Corrected.model_validate(e.payload)
            c(corrected.detail.tool)["recovered"] += corrected.detail.after
        if e.subject.startswith(S.TOOL_ATTEMPT_PREFIX):
            a = ToolAttempt.model_validate(e.payload)
            call(a.attempt_id, a.tool)[1] += 1
            c(a.tool)["retried"] += int(a.next_delay_s is not None)
        elif e.kind.startswith(("tool.succeeded.", "failure.")) and "attempt_id" in e.payload:
            o = ToolOutcome.model_validate(e.payload)
            if not o.will_retry:  # the call's final outcome
                call(o.attempt_id, o.tool)[2] = o.attempts
    for tool, events_of_call, final_attempts in calls.values():
        c(tool)["attempts"] += call_attempts(final_attempts, events_of_call)
    out: dict[str, dict[str, float]] = {}
    for tool, k in sorted(counts.items()):
        outputs = k["outputs"] or 0
        out[tool] = {
            "outputs": outputs,
            "parse_success_rate": k["parsed"] / outputs if outputs else 1.0,
            "validation_pass_rate": k["valid_first"] / outputs if outputs else 1.0,
            "repair_rate": k["repaired"] / outputs if outputs else 0.0,
            "schema_failures": k["schema_failures"],
            "correction_success_rate": k["recovered"] / k["schema_failures"] if k["schema_failures"] else 1.0,
            "attempts": k["attempts"],
            "retried_attempts": k["retried"],
        }
    return out
