"""Starting runs (a task, a scenario, a registered agent), registering agents, and listing runs."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from opentelemetry.trace import SpanKind
from pydantic import ValidationError

from loopwarden.client.door import NotAccepted, QuotaExceeded
from loopwarden.client.ids import submit_id
from loopwarden.client.refusals import PermissionDenied, guarded
from loopwarden.client.waiting import ACCEPTED, Waiting
from shared import subjects as S
from shared.agents import load_agent
from shared.bus import StreamFull, kv_scan
from shared.canonical import digest_of
from shared.describe import describe
from shared.flow import submit_stream_refusal
from shared.messages import (
    FINISHED_STATUSES,
    RUN_LIST_MAX,
    Agent,
    AgentRecord,
    AgentRegister,
    AgentRegisterReply,
    FleetView,
    FlowQuery,
    RunLimits,
    RunList,
    RunQuery,
    RunSnapshot,
    RunSubmit,
    utcnow,
)
from shared.payloads import PayloadError
from shared.scenario import Scenario
from shared.telemetry import LW_RUN_ID


def new_run_id() -> str:
    return f"run-{uuid.uuid4().hex[:20]}"


def scenario_submit(
    scenario: Scenario, run_id: str, limits: RunLimits | None = None, priority: int | None = None
) -> RunSubmit:
    """The submit of ``scenario``'s task with the scenario bound to it (replayed by scripted providers)."""
    data = scenario.model_dump(mode="json", by_alias=True)
    return RunSubmit(
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
        priority=priority,
    )


class UnknownAgent(LookupError):
    """A run of an agent that is not registered (``loopwarden agents list`` shows those that are)."""


class NotAllowed(PermissionError):
    """The server did not let this client's NATS user do it (registering agents is for operators)."""


class UnreadableAgent(ValueError):
    """What is stored under an agent's name does not read as an agent (another release's, a raw write)."""


class AgentList(list[AgentRecord]):
    """The registered agents, by name; ``unreadable``: the keys whose value does not read as one, and why."""

    unreadable: dict[str, str]

    def __init__(self) -> None:
        super().__init__()
        self.unreadable = {}


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


class Runs(Waiting):
    """Submitting runs and agents, running one to its end, listing runs."""

    @guarded
    async def submit(self, submit: RunSubmit, *, timeout: float | None = None, accepted: bool = True) -> str:
        """Submit a run; its id once a planner accepted it (``queued`` for its tenant's share of the fleet, or
        started). ``Refused`` (``QuotaExceeded`` for a quota, its limit and the current figure) when it was refused
        at the door, the submit stream being full included; ``NotAccepted`` when no planner answered within
        ``timeout`` (default ``LW_SUBMIT_ANSWER_S``): the submit is stored and is taken once a planner runs.
        ``accepted=False``: return once the submit is stored, without waiting for a planner's answer (``wait``
        then raises a refusal)."""
        await self.send(submit)
        if accepted:
            await self.accepted(submit.run_id, timeout if timeout is not None else self.settings.submit_answer_s)
        return submit.run_id

    async def send(self, submit: RunSubmit) -> None:
        """Publish a submit (stored once JetStream acknowledges it), without waiting for a planner's answer."""
        assert self.telemetry is not None
        tracer = self.telemetry.tracer("loopwarden.client")
        # The root of the run's trace: every service's spans hang below it.
        with tracer.start_as_current_span(
            f"run {submit.run_id}", kind=SpanKind.PRODUCER, attributes={LW_RUN_ID: submit.run_id}
        ):
            # on its tenant's subject: the server lets this client's user publish only its own tenant's
            subject = S.run_submit(submit.tenant or self.bus.settings.tenant)
            try:
                await self.bus.publish(subject, submit, msg_id=submit_id(submit.run_id))
            except StreamFull as err:
                limit, current = await self._submit_bounds(err.description or "")
                raise QuotaExceeded(
                    submit.run_id, submit_stream_refusal(err.description or "stream full", limit, current)
                ) from None

    async def _submit_bounds(self, description: str) -> tuple[float | None, float | None]:
        """The submit stream's bound that was hit and its current figure (None: this user may not read them)."""
        try:
            info = await self.bus.js.stream_info(S.STREAM_SUBMIT)
        except Exception:
            return None, None
        if "bytes" in description:
            return info.config.max_bytes, info.state.bytes
        return info.config.max_msgs, info.state.messages

    async def accepted(self, run_id: str, timeout: float) -> RunSnapshot:
        """The run's record once a planner wrote it (accepted: queued or started), or ``Refused``; ``NotAccepted``
        after ``timeout`` seconds."""
        try:
            return await self.wait(run_id, timeout=timeout, until=ACCEPTED, history=False)
        except TimeoutError:
            raise NotAccepted(run_id, timeout) from None

    async def submit_scenario(
        self,
        scenario: Scenario,
        run_id: str | None = None,
        limits: RunLimits | None = None,
        *,
        priority: int | None = None,
        accepted: bool = True,
    ) -> str:
        """Submit a scenario's task with the scenario bound to it (replayed by scripted providers).

        The scenario travels in the submit message (by reference when large) with its digest; only the
        planner stores it, so no client can write another run's scenario."""
        run_id = run_id or new_run_id()
        submit = scenario_submit(scenario, run_id, limits, priority)
        await self.submit(submit, accepted=accepted)
        return run_id

    async def register(self, agent: Agent | str | Path, timeout: float = 10.0) -> AgentRecord:
        """Register ``agent`` (an ``Agent``, or a YAML/JSON file of one) under its name: the stored record,
        with its version (one more than the last when the definition changed, the same when it did not).
        Only operators and the admin may (``NotAllowed`` otherwise): an agent is what every tenant's runs
        of it do. Raises ``AgentError`` for a file that is not a valid agent."""
        agent = agent if isinstance(agent, Agent) else load_agent(agent)
        subject = S.agent_register(self.identity)  # as this client's own user: the server lets no one else
        user = self.settings.nats_user or "(no user)"
        try:
            async with asyncio.timeout(timeout):
                request = self.bus.request(subject, AgentRegister(agent=agent), AgentRegisterReply)
                reply = await self.guard(request)
        except (TimeoutError, PermissionDenied):
            raise NotAllowed(
                f"agent {agent.name!r} was not registered: NATS user {user} may not publish {subject}: "
                "permission denied (only operators and the admin register agents)"
            ) from None
        if not reply.ok or reply.record is None:
            raise NotAllowed(f"agent {agent.name!r} was not registered: {reply.error or 'no record came back'}")
        return reply.record

    @guarded
    async def agent(self, name: str) -> AgentRecord | None:
        """The registered agent of that name (its definition, version and digest), or None; ``UnreadableAgent``
        when what is stored under the name does not read as an agent."""
        try:
            record, _ = await self.bus.kv_get(S.KV_AGENTS, name, AgentRecord)
        except (ValidationError, PayloadError) as err:
            why = describe(err) if isinstance(err, ValidationError) else str(err)
            raise UnreadableAgent(f"agent {name!r} is stored but cannot be read: {why}") from None
        return record

    @guarded
    async def agents(self) -> AgentList:
        """Every registered agent, by name; a stored value that does not read as one is left out and named
        in ``unreadable`` (key -> why), never hiding the others."""
        await self.bus.kv(S.KV_AGENTS)
        found, _ = await kv_scan(self.bus.nc, S.KV_AGENTS)
        listed, unreadable = AgentList(), {}
        for key, stored in sorted(found.items()):
            if stored is None or not stored.data:
                continue
            try:
                value = await self.bus.payloads.inflate_value(self.bus.nc, stored.data)
                listed.append(AgentRecord.model_validate_json(value))
            except (ValidationError, PayloadError) as err:
                unreadable[key] = describe(err) if isinstance(err, ValidationError) else str(err)
        listed.sort(key=lambda r: r.agent.name)
        listed.unreadable = unreadable
        return listed

    @guarded
    async def submit_agent(
        self,
        agent: str,
        task: str | None = None,
        *,
        scenario: Scenario | None = None,
        run_id: str | None = None,
        priority: int | None = None,
    ) -> str:
        """Start a run of the registered ``agent`` on ``task`` (live), or scripted by ``scenario`` (its task
        unless ``task`` is given): the run id. ``UnknownAgent`` when no agent has that name."""
        if await self.agent(agent) is None:
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
            priority=priority,
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
        snap = await self.wait(run_id, timeout=timeout, until=(*FINISHED_STATUSES, "awaiting_human"), history=False)
        return RunResult.of(snap)

    @guarded
    async def fleet(self) -> FleetView:
        """The fleet as flow control sees it (any planner answers): per tenant its runs queued, running and waiting
        for a person, finished per minute, the time its runs waited for their share, and each quota's use; the
        fleet's capacity and live planners. A tenant-bound client gets its own tenant's row only."""
        subject = S.flow_view(self.settings.tenant) if self.tenant_bound else S.FLOW_VIEW
        return await self.guard(self.bus.request(subject, FlowQuery(), FleetView))

    @guarded
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
        """The runs the planner keeps (``lw_runs``), newest first, filtered (see ``select_runs``). A client bound
        to a tenant asks the planner for its own runs (``rpc.runs.list.<tenant>``), a page at a time."""
        if self.tenant_bound:
            if tenant is not None and tenant != self.settings.tenant:
                return []  # a client of one tenant sees no other's runs
            return await self._listed(status, agent, since, limit, offset)
        snaps = []
        for value in await self._values(S.KV_RUNS):
            with contextlib.suppress(ValueError):  # a record this version cannot read is left out
                snaps.append(RunSnapshot.model_validate_json(value))
        return select_runs(snaps, status=status, agent=agent, tenant=tenant, since=since, limit=limit, offset=offset)

    async def _listed(
        self, status: str | None, agent: str | None, since: timedelta | None, limit: int | None, offset: int
    ) -> list[RunSnapshot]:
        out: list[RunSnapshot] = []
        at: int | None = offset
        while at is not None and (limit is None or len(out) < limit):
            page = RUN_LIST_MAX if limit is None else min(RUN_LIST_MAX, limit - len(out))
            query = RunQuery(
                status=status,
                agent=agent,
                since_s=since.total_seconds() if since is not None else None,
                limit=page,
                offset=at,
            )
            reply = await self.guard(self.bus.request(S.run_list(self.settings.tenant), query, RunList))
            out += [RunSnapshot.model_validate_json(await self._value(r)) for r in reply.runs]
            at = reply.next
        return out
