"""The client API: submit runs, watch them, read their history, work the escalation queue.

The CLI and the tests use it; it speaks the same contracts as the services. ``Client`` is one face over
parts by concept, each a module here: ``connecting`` (finding the server, the shared connection),
``reads`` (a run's state, history and events), ``queue`` (the escalation queue), ``letters`` (dead
letters), ``waiting`` (``wait``), ``runs`` (submitting runs and agents), ``scenarios`` (a scenario's
run and its check), and ``events`` (``Event``, ``Watch`` and the tool figures counted from events).
"""

from __future__ import annotations

from loopwarden.client.connecting import READY_TIMEOUT_S, Unreachable, probe, resolve_settings
from loopwarden.client.door import NotAccepted, QuotaExceeded, Refused, refusal_error
from loopwarden.client.events import Event, Watch, tool_metrics, tool_outcomes
from loopwarden.client.exports import Exports, TenantSource
from loopwarden.client.ids import submit_id
from loopwarden.client.letters import Letters, NumberedLetter, Requeued
from loopwarden.client.reads import TENANT_POLL_S
from loopwarden.client.refusals import PermissionDenied, Refusals, Violation, guarded, violation, what_of
from loopwarden.client.runs import (
    AgentList,
    NotAllowed,
    RunResult,
    UnknownAgent,
    UnreadableAgent,
    new_run_id,
    scenario_submit,
    select_runs,
)
from loopwarden.client.scenarios import Scenarios
from loopwarden.client.waiting import ACCEPTED, PROGRESS_STEMS

__all__ = [
    "ACCEPTED",
    "PROGRESS_STEMS",
    "READY_TIMEOUT_S",
    "TENANT_POLL_S",
    "AgentList",
    "Client",
    "Event",
    "NotAccepted",
    "NotAllowed",
    "NumberedLetter",
    "PermissionDenied",
    "QuotaExceeded",
    "Refusals",
    "Refused",
    "Requeued",
    "RunResult",
    "TenantSource",
    "UnknownAgent",
    "Unreachable",
    "UnreadableAgent",
    "Violation",
    "Watch",
    "guarded",
    "new_run_id",
    "probe",
    "refusal_error",
    "resolve_settings",
    "scenario_submit",
    "select_runs",
    "submit_id",
    "tool_metrics",
    "tool_outcomes",
    "violation",
    "what_of",
]


class Client(Scenarios, Letters, Exports):
    """A connection to a running Loopwarden stack: submit runs and wait for them, read and watch their
    events, work the escalation queue.

    ``async with Client() as client: ...`` finds the server as the ``loopwarden`` CLI does (``settings``'
    URL, else ``LW_NATS_URL``/``NATS_URL``, else the stack ``loopwarden up`` recorded, else the default) and
    connects within ``connect_timeout`` seconds (default ``LW_CLI_CONNECT_TIMEOUT_S``, 3) or raises
    :class:`Unreachable` naming the URL. It connects as the NATS user its settings name (``LW_NATS_USER``, its
    replies on ``_INBOX_<user>``; ``identity`` names another), and waits for what that user may see:
    ``ready_timeout`` (30 s; None: no limit, a client started before ``loopwarden bootstrap``) bounds the wait
    for JetStream once the server answers. What the server refuses that user is :class:`PermissionDenied` at
    once ("user client_acme may not read lw_escalations: permission denied"), never a timeout. A client of a
    tenant (``LW_TENANT``) reads its own runs through the planner. Once connected, a lost server is
    reconnected to without limit."""

    # --- tool metrics (derived from the event history) -------------------------------------------
    async def tool_metrics(self) -> dict[str, dict[str, float]]:
        return tool_metrics(await self.events())
