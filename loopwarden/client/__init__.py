"""The client API: submit runs, watch them, read their history, work the escalation queue.

The CLI and the tests use it; it speaks the same contracts as the services. ``Client`` is one face over
parts by concept, each a module here: ``connecting`` (finding the server, the shared connection),
``reads`` (a run's state, history and events), ``queue`` (the escalation queue), ``letters`` (dead
letters), ``waiting`` (``wait``), ``runs`` (submitting runs and agents), ``scenarios`` (a scenario's
run and its check), and ``events`` (``Event``, ``Watch`` and the tool figures counted from events).
"""

from __future__ import annotations

from loopwarden.client.connecting import READY_TIMEOUT_S, Unreachable, probe, resolve_settings
from loopwarden.client.events import Event, Watch, tool_metrics, tool_outcomes
from loopwarden.client.letters import Letters, NumberedLetter, Requeued
from loopwarden.client.reads import TENANT_POLL_S
from loopwarden.client.runs import (
    AgentList,
    NotAllowed,
    RunResult,
    UnknownAgent,
    UnreadableAgent,
    new_run_id,
    select_runs,
)
from loopwarden.client.scenarios import Scenarios
from loopwarden.client.waiting import PROGRESS_STEMS

__all__ = [
    "PROGRESS_STEMS",
    "READY_TIMEOUT_S",
    "TENANT_POLL_S",
    "AgentList",
    "Client",
    "Event",
    "NotAllowed",
    "NumberedLetter",
    "Requeued",
    "RunResult",
    "UnknownAgent",
    "Unreachable",
    "UnreadableAgent",
    "Watch",
    "new_run_id",
    "probe",
    "resolve_settings",
    "select_runs",
    "tool_metrics",
    "tool_outcomes",
]


class Client(Scenarios, Letters):
    """A connection to a running Loopwarden stack: submit runs and wait for them, read and watch their
    events, work the escalation queue.

    ``async with Client() as client: ...`` finds the server as the ``loopwarden`` CLI does (``settings``'
    URL, else ``LW_NATS_URL``/``NATS_URL``, else the stack ``loopwarden up`` recorded, else the default) and
    connects within ``connect_timeout`` seconds (default ``LW_CLI_CONNECT_TIMEOUT_S``, 3) or raises
    :class:`Unreachable` naming the URL. ``ready_timeout`` bounds the wait for JetStream's streams once the
    server answers; by default 30 s, and no limit on a managed cluster (``LW_MANAGE_STREAMS=false``), where
    a client started before ``loopwarden bootstrap`` waits for it as the services do (logged, naming what is
    missing). Once connected, a lost server is reconnected to without limit."""

    # --- tool metrics (derived from the event history) -------------------------------------------
    async def tool_metrics(self) -> dict[str, dict[str, float]]:
        return tool_metrics(await self.events())
