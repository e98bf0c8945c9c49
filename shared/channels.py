"""The channel table: every subject a message travels on, once - its contract, who may publish it, who
consumes or answers it, and what it is. The rest is derived from it:

- the publish side of every user's grant (``shared/permissions.py`` -> ``deploy/nats/auth.conf``),
- the publishers of the AsyncAPI document (``shared/asyncapi.py`` -> ``schemas/asyncapi.json``; the
  consuming side there is read from the handlers each service registers),
- the stream a channel lives in (``S.stream_for``, from ``S.STREAM_SUBJECTS``).

Subject *names* stay in ``shared/subjects.py`` (the builders every service calls). A new channel is one
row here plus ``make schemas`` (docs/contributing.md, "Adding a channel").

An address writes a token that varies as ``{param}``; an event of a run gets the run id as one more token
(``{run}``, added here as the bus adds it). In a grant, a parameter becomes what its publisher may put
there: its own name where the server pins it (``pinned``), the listed ``values``, else any token - the
first such makes the rest of the subject free (``>``, or ``*`` per ``free``); a run token alone is ``*``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel

from shared import subjects as S
from shared.failures import EXECUTOR_FAILURES, RUN_FAILURES
from shared.messages import (
    PLANNER_FAILURES,
    AgentRegister,
    BudgetRequest,
    DeadLetter,
    Escalation,
    EscalationClaim,
    EscalationEvent,
    EscalationQuery,
    EscalationRaise,
    EscalationResolution,
    EscalationResolve,
    EscalationWithdraw,
    FlowQuery,
    FlowTicket,
    JudgeRequest,
    LetterHandled,
    McpServerStatus,
    Requeue,
    RunAdvance,
    RunEvent,
    RunQuery,
    RunRead,
    RunSubmit,
    ToolAttempt,
    ToolCall,
    ToolOutcome,
    ToolResultRaw,
    Verdict,
)

Kind = Literal["command", "event", "request", "dead_letter", "api"]
# Publisher groups: ``tenant_client`` is every tenant-bound client user, ``operator`` every operator, ``all``
# every service; any other name is one user (``client``: the default tenant's client, which reads every run).
# ``stream``: no user - the stream itself writes the subject (a subject transform); no grant follows from it.
SERVICES = ("planner", "executor", "validator", "judge", "governor", "escalation")
GROUPS = ("tenant_client", "operator", "all")


@dataclass(frozen=True)
class Channel:
    address: str  # the subject, ``{param}`` for each token that varies (a run's event: without ``{run}``)
    model: type[BaseModel] | None  # the contract; None for a JetStream API subject
    publishers: tuple[str, ...]  # users or groups (``GROUPS``) allowed to publish it
    subscribers: tuple[str, ...]  # the services that consume or answer it (their handlers declare how)
    kind: Kind
    description: str  # ``{param}`` in it is replaced by the param's values, comma-separated
    values: dict[str, tuple[str, ...]] = field(default_factory=dict)  # what a publisher may put in a param
    pinned: tuple[str, ...] = ()  # params the server pins to the publisher's own name (or tenant)
    free: Literal[">", "*"] = ">"  # what the first free param of a grant becomes

    @property
    def subject(self) -> str:
        """The address as published: a param with one allowed value written out, and the run token of a
        run's event added."""
        address = re.sub(
            r"\{(\w+)\}", lambda m: v[0] if len(v := self.values.get(m[1], ())) == 1 else m[0], self.address
        )
        stem = address.split(".{", 1)[0]
        return f"{address}.{{run}}" if S.is_run_scoped(stem) else address

    @property
    def stream(self) -> str | None:
        """The stream that holds it (None: core NATS request/reply, or a JetStream API subject)."""
        return None if self.kind == "api" else S.stream_for(re.sub(r"\{\w+\}", "x", self.subject))

    @property
    def summary(self) -> str:
        return re.sub(r"\{(\w+)\}", lambda m: ", ".join(self.values.get(m[1], (m[0],))), self.description)

    def grant(self, pins: dict[str, str]) -> list[str]:
        """The publish patterns of a user whose pinned params are ``pins`` (e.g. ``{"service": "planner"}``)."""
        patterns = [""]
        tokens = self.subject.split(".")
        for i, part in enumerate(tokens):
            param = part[1:-1] if part.startswith("{") and part.endswith("}") else None
            if param is None:
                patterns = [f"{p}.{part}" for p in patterns]
            elif param in self.pinned:
                patterns = [f"{p}.{S.token(pins[param])}" for p in patterns]
            elif param in self.values:
                patterns = [f"{p}.{v}" for p in patterns for v in self.values[param]]
            else:
                last_is_run = param == "run" and i == len(tokens) - 1
                wildcard = "*" if last_is_run else self.free
                patterns = [f"{p}.{wildcard}" for p in patterns]
                if wildcard == ">":
                    break
        return [p[1:] for p in patterns]


F = S.FAILURE_PREFIX
ESC = S.ESCALATION_EVENT_PREFIX
CHANNELS: tuple[Channel, ...] = (
    # --- commands: one durable per consuming service shares the work between its replicas ----------------
    Channel(
        f"{S.RUN_SUBMIT_PREFIX}.{{tenant}}",
        RunSubmit,
        ("client", "tenant_client"),
        ("planner",),
        "command",
        "a run to start (loopwarden submit, the demo), on the tenant's own subject: the server lets each client "
        "user publish only its tenant's",
        pinned=("tenant",),
    ),
    Channel(
        f"{S.RUN_SUBMIT_PREFIX}.{{partition}}.{{tenant}}",
        RunSubmit,
        ("stream",),  # LW_SUBMIT's subject transform: no user may publish here
        ("planner",),
        "command",
        "a submit as LW_SUBMIT stores it: under its tenant's partition of the door (the stream's subject "
        "transform; no one publishes here), taken by the planner's durable of that partition",
    ),
    Channel(
        f"{S.RUN_SUBMIT_PREFIX}.{{tenant}}.{S.REPLAY}",
        RunSubmit,
        ("operator", "console"),
        ("planner",),
        "command",
        "a replay of a recorded run (loopwarden replay as an operator, the console's Replay), charged to the "
        "replayed run's tenant: its scenario is taken whatever LW_ALLOW_SCRIPTED says",
        free="*",
    ),
    Channel(
        S.RUN_SPAWN,
        RunSubmit,
        ("planner",),
        ("planner",),
        "command",
        "planner to planner: a sub-agent run (only the planner starts a child)",
    ),
    Channel(
        S.RUN_ADVANCE,
        RunAdvance,
        ("planner",),
        ("planner",),
        "command",
        "planner to planner: take the run's next model turn",
    ),
    Channel(
        f"{S.TOOL_EXECUTE_PREFIX}.{{tool}}",
        ToolCall,
        ("planner", "executor"),
        ("executor",),
        "command",
        "a tool call for the executor hosting it (the executor's own: a fallback tool's call)",
    ),
    Channel(
        S.RESULT_VALIDATE,
        ToolResultRaw,
        ("executor",),
        ("validator",),
        "command",
        "a tool's raw result, to check against its output contract",
    ),
    Channel(S.JUDGE_SCORE, JudgeRequest, ("planner",), ("judge",), "command", "a fresh candidate answer to score"),
    Channel(
        S.ESCALATION_RAISE, EscalationRaise, ("planner",), ("escalation",), "command", "a decision a human must take"
    ),
    Channel(
        S.ESCALATION_WITHDRAW,
        EscalationWithdraw,
        ("planner",),
        ("escalation",),
        "command",
        "a decision no human needs to take any more (a call's result became known): the item closes",
    ),
    Channel(
        f"{S.REQUEUE_PREFIX}.{{service}}",
        Requeue,
        ("operator", "planner"),
        tuple(s for s in SERVICES if s != "executor"),
        "command",
        "a dead letter handed back to the service that gave up on it (loopwarden dlq requeue; the planner: a "
        "person's requeue of a stalled run's queue item)",
    ),
    Channel(
        f"{S.REQUEUE_PREFIX}.executor.{{tool}}",
        Requeue,
        ("operator", "planner"),
        ("executor",),
        "command",
        "a dead letter handed back to the executor replicas hosting its tool (loopwarden dlq requeue)",
    ),
    Channel(
        f"{S.FLOW_TICKET_PREFIX}.{{tenant}}.{{priority}}",
        FlowTicket,
        ("planner",),
        (),
        "command",
        "a run waiting for its tenant's share of the fleet (LW_FLOW): a planner takes the oldest of the highest "
        "priority by direct get and deletes it, no consumer",
    ),
    # --- requests on core NATS (a queue group per answering service) ------------------------------------
    Channel(
        S.FLOW_VIEW,
        FlowQuery,
        ("client", "console", "operator"),
        ("planner",),
        "request",
        "the fleet as flow control sees it: every tenant's queued, running, finished, waits and quotas",
    ),
    Channel(
        f"{S.FLOW_VIEW}.{{tenant}}",
        FlowQuery,
        ("tenant_client",),
        ("planner",),
        "request",
        "a tenant-bound client's own row of the fleet's view",
        pinned=("tenant",),
    ),
    Channel(
        f"{S.RUN_READ_PREFIX}.{{verb}}.{{tenant}}",
        RunRead,
        ("tenant_client",),
        ("planner",),
        "request",
        "a tenant-bound client reads one of its own runs ({verb})",
        values={"verb": S.RUN_READ_VERBS},
        pinned=("tenant",),
    ),
    Channel(
        f"{S.RUN_READ_PREFIX}.{S.RUN_LIST}.{{tenant}}",
        RunQuery,
        ("tenant_client",),
        ("planner",),
        "request",
        "a tenant-bound client lists its own runs, a page at a time",
        pinned=("tenant",),
    ),
    Channel(
        S.BUDGET_RESERVE,
        BudgetRequest,
        ("planner",),
        ("governor",),
        "request",
        "reserve a model call's budget before it is made",
    ),
    Channel(
        S.ESCALATION_LIST,
        EscalationQuery,
        ("client", "console", "operator"),
        ("escalation",),
        "request",
        "list the human queue",
    ),
    Channel(
        S.ESCALATION_SHOW,
        EscalationQuery,
        ("client", "console", "operator"),
        ("escalation",),
        "request",
        "one item of the human queue",
    ),
    Channel(
        f"{S.ESCALATION_RPC_PREFIX}.{{verb}}.console.{{operator}}",
        EscalationClaim,
        ("console",),
        ("escalation",),
        "request",
        "the console acts ({verb}) for the operator logged in to it",
        values={"verb": ("claim", "renew")},
        free="*",
    ),
    Channel(
        f"{S.ESCALATION_RPC_PREFIX}.{{verb}}.console.{{operator}}",
        EscalationResolve,
        ("console",),
        ("escalation",),
        "request",
        "the console acts ({verb}) for the operator logged in to it",
        values={"verb": ("resolve",)},
        free="*",
    ),
    Channel(
        f"{S.ESCALATION_RPC_PREFIX}.{{verb}}.{{operator}}",
        EscalationClaim,
        ("operator",),
        ("escalation",),
        "request",
        "an operator acts ({verb}) on the human queue as themselves",
        values={"verb": ("claim", "renew")},
        pinned=("operator",),
    ),
    Channel(
        f"{S.ESCALATION_RPC_PREFIX}.{{verb}}.{{operator}}",
        EscalationResolve,
        ("operator",),
        ("escalation",),
        "request",
        "an operator acts ({verb}) on the human queue as themselves",
        values={"verb": ("resolve",)},
        pinned=("operator",),
    ),
    Channel(
        f"{S.AGENT_REGISTER_PREFIX}.{{operator}}",
        AgentRegister,
        ("operator",),
        ("escalation",),
        "request",
        "an operator registers an agent as themselves (the roster decides; the record says who)",
        pinned=("operator",),
    ),
    # --- JetStream API reads that are part of the topology ----------------------------------------------
    Channel(
        f"$JS.API.CONSUMER.INFO.{S.STREAM_CMD}.{{durable}}",
        None,
        ("planner", "client"),
        (),
        "api",
        "read only: whether a running executor pulls a tool's calls",
        free="*",
    ),
    # --- events: every consuming service has its own durable -------------------------------------------
    Channel(
        f"{S.RUN_EVENT_PREFIX}.{{kind}}",
        RunEvent,
        ("planner",),
        ("governor",),
        "event",
        "the run's progress, one event per step",
    ),
    Channel(
        S.run_event("rate_limited"),
        RunEvent,
        ("judge",),
        (),
        "event",
        "the judge's model call for a run waits for its provider key's rate limit (the planner's own: above)",
    ),
    Channel(
        f"{F}.{{type}}.{{tool}}",
        RunEvent,
        ("planner",),
        (),
        "event",
        "a run-level failure (type loop, budget or judge; tool `_` when none)",
        values={"type": RUN_FAILURES},
    ),
    Channel(
        f"{F}.{{type}}.{{tool}}",
        ToolOutcome,
        ("planner",),
        (),
        "event",
        "a call to a tool no replica hosts (or the run does not offer): never dispatched, the model corrects",
        values={"type": PLANNER_FAILURES},  # decided before dispatch
    ),
    Channel(
        f"{S.TOOL_SUCCEEDED_PREFIX}.delegate",
        ToolOutcome,
        ("planner",),
        ("planner",),
        "event",
        "a sub-agent's answer to its parent run (the delegate tool's result)",
    ),
    Channel(
        f"{F}.tool_error.delegate",
        ToolOutcome,
        ("planner",),
        ("planner",),
        "event",
        "a sub-agent that did not answer, as its parent's delegate call failing",
    ),
    Channel(f"{S.TOOL_ATTEMPT_PREFIX}.{{tool}}", ToolAttempt, ("executor",), (), "event", "one attempt of a tool call"),
    Channel(
        f"{F}.{{type}}.{{tool}}",
        ToolOutcome,
        ("executor",),
        ("planner", "escalation"),
        "event",
        "a tool call failed ({type})",
        values={"type": EXECUTOR_FAILURES},  # output_invalid: the validator's
    ),
    Channel(
        S.LETTER_HANDLED,
        LetterHandled,
        ("all",),
        ("planner",),
        "event",
        "a dead letter handed back was handled: the run it held up moves on",
    ),
    Channel(
        f"{S.MCP_SERVER_EVENT_PREFIX}.{{server}}",
        McpServerStatus,
        ("executor",),
        (),
        "event",
        "an MCP server's status changed",
    ),
    Channel(
        f"{S.TOOL_SUCCEEDED_PREFIX}.{{tool}}",
        ToolOutcome,
        ("validator",),
        ("planner",),
        "event",
        "a validated (maybe repaired) result",
    ),
    Channel(
        f"{F}.output_invalid.{{tool}}",
        ToolOutcome,
        ("validator", "executor"),  # the executor: a result over LW_TOOL_OUTPUT_MAX_BYTES, never sent on to validate
        ("planner",),
        "event",
        "a result that breaks its contract (or is too large to be one)",
    ),
    Channel(S.JUDGE_VERDICT, Verdict, ("judge",), ("planner",), "event", "the verdict on a candidate answer"),
    Channel(
        f"{S.BUDGET_EVENT_PREFIX}.{{level}}", RunEvent, ("governor",), (), "event", "a budget threshold was crossed"
    ),
    Channel(S.ESCALATION_RAISED, Escalation, ("escalation",), (), "event", "a new item in the human queue"),
    Channel(S.ESCALATION_CLAIMED, EscalationEvent, ("escalation",), (), "event", "an operator claimed an item"),
    Channel(
        f"{ESC}.{{event}}", EscalationEvent, ("escalation",), (), "event", "renewed, expired, refused or sla_applied"
    ),
    Channel(
        S.ESCALATION_RESOLVED,
        EscalationResolution,
        ("escalation",),
        ("planner",),
        "event",
        "an item was resolved; the run resumes",
    ),
    # --- dead letters ------------------------------------------------------------------------------------
    Channel(
        f"{S.DLQ_PREFIX}.{{service}}",
        DeadLetter,
        ("all",),
        ("planner",),
        "dead_letter",
        "a message that could not be handled, with the reason (the planner marks the run it held up stalled)",
        pinned=("service",),
    ),
)


def publish_patterns(user: str, groups: tuple[str, ...], pins: dict[str, str]) -> tuple[str, ...]:
    """Every publish pattern ``user`` gets from the table, in table order: the rows it (or one of its
    ``groups``) publishes, with its pinned params (``pins``). A pattern another one of its patterns
    already covers is left out."""
    who = {user, *groups}
    found: list[str] = []
    for channel in CHANNELS:
        if who & set(channel.publishers):
            found += channel.grant(pins)
    unique = list(dict.fromkeys(found))
    return tuple(p for p in unique if not any(q != p and covers(q, p) for q in unique))


def covers(pattern: str, other: str) -> bool:
    """Whether every subject ``other`` matches also matches ``pattern`` (both NATS patterns)."""
    want, got = pattern.split("."), other.split(".")
    for i, part in enumerate(want):
        if part == ">":
            return len(got) > i
        if i >= len(got) or got[i] == ">" or (part != "*" and part != got[i]) or (part == "*" and got[i] == ">"):
            return False
    return len(got) == len(want)


def documented() -> dict[str, tuple[Channel, ...]]:
    """What each publisher (user or group) publishes on JetStream, for the AsyncAPI document."""
    out: dict[str, list[Channel]] = {}
    for channel in CHANNELS:
        if channel.kind in ("command", "event", "dead_letter"):
            for who in channel.publishers:
                out.setdefault(who, []).append(channel)
    return {who: tuple(rows) for who, rows in out.items()}
