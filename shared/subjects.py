"""Every NATS subject, stream, consumer and bucket name, in one place.

Shape: ``lw.<version>.<cmd|evt|rpc|dlq>.<area>.<verb>[.<tokens>]``. Commands go to one
replica (a shared durable consumer), events fan out (one durable per consuming service),
and a failure's *type* and *tool* are subject tokens so that routing a failure is a
subscription, e.g. ``lw.v1.evt.failure.transient.search`` or ``lw.v1.evt.failure.fatal.>``.
A breaking contract change gets ``lw.v2`` beside ``lw.v1``; additive fields do not.

These are the names; what travels on each subject, who publishes and who consumes it is the channel
table (``shared/channels.py``).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shared.failures import FailureType

VERSION = "v1"
P = f"lw.{VERSION}"

# --- commands (JetStream stream LW_CMD) ----------------------------------------------------
# a run submitted by a client: ``<prefix>.<tenant>``; the server lets each client user publish only its own
# tenant's subject, so the planner takes the tenant from the subject, never from the body
RUN_SUBMIT_PREFIX = f"{P}.cmd.run.submit"
DEFAULT_TENANT = "default"
# The door is partitioned by tenant so that one tenant's burst of submits does not sit in front of another's:
# LW_SUBMIT stores ``<prefix>.<tenant>`` as ``<prefix>.<k>.<tenant>``, k a hash of the tenant in 0..N-1 (a subject
# transform of the stream), and the planner takes each partition through its own durable (``submit_durable``).
# Two tenants share a partition with odds 1/N: then their submits are taken in arrival order, as before.
SUBMIT_PARTITIONS = 8
RUN_SPAWN = f"{P}.cmd.run.spawn"  # planner -> planner: a sub-agent run (only the planner may start a child)
RUN_ADVANCE = f"{P}.cmd.run.advance"  # planner -> planner: take the next model turn
TOOL_EXECUTE_PREFIX = f"{P}.cmd.tool.execute"
RESULT_VALIDATE = f"{P}.cmd.result.validate"
JUDGE_SCORE = f"{P}.cmd.judge.score"
ESCALATION_RAISE = f"{P}.cmd.escalation.raise"
ESCALATION_WITHDRAW = f"{P}.cmd.escalation.withdraw"  # the raiser no longer needs a human for an item
# operator -> a service: a dead letter handed back (``requeue(service)``; ``loopwarden dlq requeue``)
REQUEUE_PREFIX = f"{P}.cmd.requeue"

# --- request/reply on core NATS (deliberately outside every stream: a stream capturing
# a request subject would answer it with a PubAck instead of the service's reply) -------
BUDGET_RESERVE = f"{P}.rpc.budget.reserve"
ESCALATION_LIST = f"{P}.rpc.escalation.list"
ESCALATION_CLAIM = f"{P}.rpc.escalation.claim"
ESCALATION_RESOLVE = f"{P}.rpc.escalation.resolve"
# a tenant-bound client reads its runs through the planner (``services/planner/reads.py``):
# ``<prefix>.<verb>.<tenant>``, and the server lets each such client publish only its own tenant's
RUN_READ_PREFIX = f"{P}.rpc.runs"
# the fleet as flow control sees it (``loopwarden fleet``), answered by any planner: every tenant's row, or
# ``<it>.<tenant>`` for a tenant-bound client (its own row only; the server lets it publish only its own)
FLOW_VIEW = f"{P}.rpc.flow.view"
# an operator (or the admin) registers an agent as itself: ``<prefix>.<user>``, answered by the escalation service
AGENT_REGISTER_PREFIX = f"{P}.rpc.agents.register"
RUN_READ_VERBS = ("state", "history", "events", "values")  # one run (``RunRead``)
RUN_LIST = "list"  # a tenant's runs, a page at a time (``RunQuery``): ``<prefix>.list.<tenant>``
# a replay an operator (or the console for one, or the admin) starts: ``<submit prefix>.<tenant>.replay``, the
# tenant the replayed run was of (it pays). The planner takes its scenario whatever LW_ALLOW_SCRIPTED says, and
# no client user may publish it (each publishes its own tenant's submit subject only).
REPLAY = "replay"

# --- events (JetStream stream LW_EVT) ------------------------------------------------------
RUN_EVENT_PREFIX = f"{P}.evt.run"
TOOL_SUCCEEDED_PREFIX = f"{P}.evt.tool.succeeded"
TOOL_ATTEMPT_PREFIX = f"{P}.evt.tool.attempt"
FAILURE_PREFIX = f"{P}.evt.failure"
BUDGET_EVENT_PREFIX = f"{P}.evt.budget"
JUDGE_VERDICT = f"{P}.evt.judge.verdict"
ESCALATION_EVENT_PREFIX = f"{P}.evt.escalation"
ESCALATION_RAISED = f"{ESCALATION_EVENT_PREFIX}.raised"
ESCALATION_CLAIMED = f"{ESCALATION_EVENT_PREFIX}.claimed"
ESCALATION_RESOLVED = f"{ESCALATION_EVENT_PREFIX}.resolved"
MCP_SERVER_EVENT_PREFIX = f"{P}.evt.mcp.server"  # executor: an MCP server started, failed, died, restarted
# any consuming service: a dead letter handed back was handled (the planner moves the run it held up on)
LETTER_HANDLED = f"{P}.evt.letter.handled"

# --- dead letters (JetStream stream LW_DLQ) --------------------------------------------------
DLQ_PREFIX = f"{P}.dlq"

# --- claim-check bodies (JetStream stream LW_PAYLOADS, ``shared/payloads.py``) ------------------
# ``lw.v1.payload.<user>.<sha256>.<chunk>``: each user writes under its own token only (its grant), and
# every subject holds one message, written once (the stream refuses a second: ``discard_new_per_subject``).
PAYLOAD_PREFIX = f"{P}.payload"

# --- flow control: the tickets of runs waiting for their tenant's share (JetStream stream LW_FLOW) -------------
# ``lw.v1.flow.ticket.<tenant>.<priority>``: one message per waiting run, in the order they came; a planner
# reads the oldest of a subject by direct get, takes it in the fleet's record (compare-and-swap) and removes the
# tickets it took with a purge of the subject up to the last. Nothing consumes the stream.
FLOW_TICKET_PREFIX = f"{P}.flow.ticket"

STREAM_CMD = "LW_CMD"
STREAM_SUBMIT = "LW_SUBMIT"
STREAM_EVT = "LW_EVT"
STREAM_DLQ = "LW_DLQ"
STREAM_PAYLOADS = "LW_PAYLOADS"
STREAM_FLOW = "LW_FLOW"
# The subjects an untrusted user (a client, an operator) may publish live in a stream of their own:
# JetStream de-duplicates by ``Nats-Msg-Id`` per stream, so a client's message id can never pre-claim
# a service's (predictable) id on LW_CMD. LW_CMD lists the services' commands one by one.
STREAM_SUBJECTS: dict[str, list[str]] = {
    STREAM_CMD: [
        RUN_ADVANCE,
        RUN_SPAWN,  # a sub-agent run the planner starts (planner only)
        f"{TOOL_EXECUTE_PREFIX}.>",
        RESULT_VALIDATE,
        JUDGE_SCORE,
        ESCALATION_RAISE,
        ESCALATION_WITHDRAW,
    ],
    # the per-tenant submit subjects (``<submit>.<tenant>``) and the operators' requeues
    STREAM_SUBMIT: [f"{RUN_SUBMIT_PREFIX}.>", f"{REQUEUE_PREFIX}.>"],
    STREAM_EVT: [f"{P}.evt.>"],
    STREAM_DLQ: [f"{P}.dlq.>"],
    STREAM_PAYLOADS: [f"{PAYLOAD_PREFIX}.>"],
    STREAM_FLOW: [f"{P}.flow.>"],
}
# where the services' durable consumers live (LW_DLQ: the planner's, which marks runs held up by a letter)
STREAMS_WITH_DURABLES = (STREAM_CMD, STREAM_SUBMIT, STREAM_EVT, STREAM_DLQ)

# --- durable consumers (a command's is shared by the replicas of its service; an event's is the
# consuming service's own) -----------------------------------------------------------------------
DURABLE_PLANNER_SUBMIT = "planner_submit"  # submits stored before the door was partitioned (``<prefix>.<tenant>``)


def submit_durable(partition: int) -> str:
    """The planner's durable of one partition of the door (``<prefix>.<partition>.*``)."""
    return f"planner_submit_{partition}"


def submit_partition(partition: int | str) -> str:
    """The stored subjects of one partition of the door (``<prefix>.<partition>.<tenant>``)."""
    return f"{RUN_SUBMIT_PREFIX}.{partition}.*"


SUBMIT_TRANSFORM = (
    f"{RUN_SUBMIT_PREFIX}.*",
    f"{RUN_SUBMIT_PREFIX}.{{{{partition({SUBMIT_PARTITIONS},1)}}}}.{{{{wildcard(1)}}}}",
)
DURABLE_PLANNER_SPAWN = "planner_spawn"
DURABLE_PLANNER_ADVANCE = "planner_advance"
DURABLE_PLANNER_OUTCOMES = "planner_outcomes"
DURABLE_PLANNER_VERDICTS = "planner_verdicts"
DURABLE_PLANNER_RESOLUTIONS = "planner_resolutions"
DURABLE_PLANNER_LETTERS = "planner_letters"  # LW_DLQ: a run held up by a dead letter is marked stalled
DURABLE_PLANNER_HANDLED = "planner_handled"  # LW_EVT: a letter handed back was handled, the run moves on
DURABLE_VALIDATOR = "validator"
DURABLE_JUDGE = "judge"
DURABLE_ESCALATION_RAISE = "escalation_raise"
DURABLE_ESCALATION_FAILURES = "escalation_failures"
DURABLE_ESCALATION_WITHDRAW = "escalation_withdraw"
DURABLE_GOVERNOR_RUN_FINISHED = "governor_run_finished"


def executor_durable(tool: str) -> str:
    """One durable per hosted tool: the subject (and its permissions) is the tool's boundary."""
    return f"executor_{token(tool)}"


def requeue(service: str, scope: str | None = None) -> str:
    """Where a dead letter of ``service`` is handed back to it: one subject per service, or per ``scope``
    where its replicas differ in what they consume (the executor: per hosted tool)."""
    return f"{REQUEUE_PREFIX}.{token(service)}" + (f".{token(scope)}" if scope else "")


def requeue_durable(service: str, scope: str | None = None) -> str:
    """The durable that takes ``requeue(service, scope)``, shared by the replicas that consume that scope.
    ``requeue_<service>``, not ``<service>_requeue``: ``executor_<tool>`` is the executor's per-tool
    namespace, and a tool named ``requeue`` must not share a durable with the executor's letters."""
    return f"requeue_{token(service)}" + (f"_{token(scope)}" if scope else "")


# --- key-value buckets -------------------------------------------------------------------------
KV_RUNS = "lw_runs"  # planner: one key per run, CAS on revision
KV_MODEL_CALLS = "lw_model_calls"  # planner: model responses per (run, turn)
KV_SCENARIOS = "lw_scenarios"  # client: scripted scenario per run
KV_CONTRACTS = "lw_contracts"  # executor: registered tool contracts
KV_TOOL_LEDGER = "lw_tool_ledger"  # executor: attempts and outcomes per call
KV_TOOL_CACHE = "lw_tool_cache"  # validator: last good result per (tool, arguments)
KV_SCRIPT_CURSORS = "lw_script_cursors"  # executor: scripted tool behaviour cursors
KV_VERDICTS = "lw_verdicts"  # judge: one verdict per candidate
KV_BUDGETS = "lw_budgets"  # governor: ledger and threshold flags per run
KV_ESCALATIONS = "lw_escalations"  # escalation: the human queue
KV_LESSONS = "lw_lessons"  # planner: failure reasons per task, for opt-in lessons
KV_DEMO = "lw_demo"  # demo tools' side effects (payments ledger)
KV_MCP_SERVERS = "lw_mcp_servers"  # executor: status per mounted MCP server (and executor)
KV_HISTORY = "lw_history"  # planner: a run's conversation, one key per message (<run>.<seq>), written once
KV_CONSOLE_SESSIONS = "lw_console_sessions"  # console: revoked sessions, shared by every replica
KV_REQUEUES = "lw_requeues"  # every consuming service: <service>.<letter> once it took that letter back
KV_AGENTS = "lw_agents"  # operators (and the admin): registered agent definitions, one key per agent name
KV_FLOW = "lw_flow"  # planner: the fleet's admission record (``fleet``: each tenant's runs in flight, ...)
KV_HUMAN_COUNTS = "lw_human_counts"  # escalation: each tenant's open items in the human queue (key ``open``)
KV_REPLICAS = "lw_replicas"  # every service replica: <service>.<instance> heartbeats (entries expire), the fleet
KV_CONFIG = "lw_config"  # the admin: the access file applied (``loopwarden config apply``), read live by services
CONFIG_ACCESS, CONFIG_CONSOLE = "access", "console"  # its keys (``shared/messages/config.py``)
# planner and judge: one record per provider key, <provider>.<account> (the key's hash), shared by every replica:
# its limits learned or set, the pace (a theoretical arrival time per dimension), a 429's pause
KV_RATE_LIMITS = "lw_ratelimits"
ALL_BUCKETS = (
    KV_RUNS,
    KV_MODEL_CALLS,
    KV_SCENARIOS,
    KV_CONTRACTS,
    KV_TOOL_LEDGER,
    KV_TOOL_CACHE,
    KV_SCRIPT_CURSORS,
    KV_VERDICTS,
    KV_BUDGETS,
    KV_ESCALATIONS,
    KV_LESSONS,
    KV_DEMO,
    KV_MCP_SERVERS,
    KV_HISTORY,
    KV_CONSOLE_SESSIONS,
    KV_REQUEUES,
    KV_AGENTS,
    KV_FLOW,
    KV_HUMAN_COUNTS,
    KV_REPLICAS,
    KV_CONFIG,
    KV_RATE_LIMITS,
)

_TOKEN_OK = re.compile(r"[^A-Za-z0-9_-]")
# nats-server closes a connection whose control line (``PUB <subject> <reply> <sizes>``) passes 4 KiB,
# and nats-py does not reconnect after that: no subject may come near it, whatever id a client sent.
# A token or key longer than this keeps its head and gets a digest of the whole in place of its tail.
MAX_TOKEN = 128
MAX_KEY = 512


def _bounded(value: str, limit: int) -> str:
    if len(value) <= limit:
        return value
    import hashlib

    return value[: limit - 17] + "_" + hashlib.sha256(value.encode()).hexdigest()[:16]


def token(value: str) -> str:
    """Make ``value`` safe as one subject token (no dots, spaces or wildcards; at most ``MAX_TOKEN``)."""
    cleaned = _TOKEN_OK.sub("_", value)
    return _bounded(cleaned, MAX_TOKEN) or "_"


# The users every deployment has: the admin, the services, the default tenant's client and the console. Every
# other user is a person's, named in the access file an admin applies (``shared/access.py``): a tenant-bound
# client or an operator. Their names are reserved there, with the first token of the people's inboxes and
# stored bodies (``tenant``, ``operator``), so no person's own inbox or bodies can cover another's.
BUILT_IN_USERS = ("admin", "planner", "executor", "validator", "judge", "governor", "escalation", "client", "console")
TENANT_ROLE, OPERATOR_ROLE = "tenant", "operator"


def inbox_prefix(user: str, tenant: str | None = None) -> str:
    """The reply-inbox prefix of ``user``'s connection (its grant lets it read only its own): ``_INBOX_<user>``
    for a built-in user; a person's is under its role, ``_INBOX_tenant.<user>`` for a client bound to a tenant
    (``tenant`` set and not the default one) and ``_INBOX_operator.<user>`` otherwise, so a responder's grant
    names every person of a role with one wildcard (``people_inboxes``): adding a tenant or an operator
    changes no service's grant."""
    if user in BUILT_IN_USERS:
        return f"_INBOX_{token(user)}"
    role = TENANT_ROLE if tenant and tenant != DEFAULT_TENANT else OPERATOR_ROLE
    return f"_INBOX_{role}.{token(user)}"


def people_inboxes(role: str) -> str:
    """Every inbox of the people of ``role`` (``tenant`` or ``operator``): what a responder to them publishes on."""
    return f"_INBOX_{token(role)}.>"


def kv_key(*parts: str) -> str:
    """A KV key from parts; KV keys allow ``[-/_=.a-zA-Z0-9]``; each part at most ``MAX_KEY`` characters."""
    return ".".join(_bounded(re.sub(r"[^-/_=a-zA-Z0-9]", "_", p), MAX_KEY) or "_" for p in parts)


def run_submit(tenant: str | None = None) -> str:
    """The subject a run of ``tenant`` (the default tenant when None) is submitted on."""
    return f"{RUN_SUBMIT_PREFIX}.{token(tenant or DEFAULT_TENANT)}"


def run_replay(tenant: str | None = None) -> str:
    """The subject an operator replays a run of ``tenant`` on (the default tenant when None)."""
    return f"{run_submit(tenant)}.{REPLAY}"


def run_list(tenant: str) -> str:
    """The subject a client of ``tenant`` lists its runs on."""
    return f"{RUN_READ_PREFIX}.{RUN_LIST}.{token(tenant)}"


def run_read(verb: str, tenant: str) -> str:
    """The subject a client of ``tenant`` asks the planner for one of its runs (``verb``: ``RUN_READ_VERBS``)."""
    return f"{RUN_READ_PREFIX}.{token(verb)}.{token(tenant)}"


def flow_view(tenant: str | None = None) -> str:
    """Where the fleet's view is asked for: every tenant's (None), or one tenant's (a tenant-bound client)."""
    return FLOW_VIEW if tenant is None else f"{FLOW_VIEW}.{token(tenant)}"


def flow_ticket(tenant: str, priority: int | str) -> str:
    """The subject of a waiting run's ticket: its tenant and priority (``*`` patterns allowed as arguments)."""
    return f"{FLOW_TICKET_PREFIX}.{tenant if tenant == '*' else token(tenant)}.{priority}"


def agent_register(user: str) -> str:
    """The subject ``user`` registers an agent on (the server lets only that user publish it)."""
    return f"{AGENT_REGISTER_PREFIX}.{token(user)}"


def tenant_bodies(tenant: str) -> str:
    """The claim-check owner (``lw.v1.payload.<it>.>``) of the large bodies the planner hands a tenant-bound
    client in its reads (``run_read``): that tenant's client may read these and its own, no one else's. Two
    tokens, ``tenant.<tenant>``: the planner's grant covers every tenant's with ``lw.v1.payload.tenant.>``."""
    return f"{TENANT_ROLE}.{token(tenant)}"


def payload_owner(owner: str) -> str:
    """The owner part of a stored body's subject: one token (a user), or ``tenant.<tenant>`` (``tenant_bodies``)."""
    role, dot, rest = owner.partition(".")
    if dot and role == TENANT_ROLE:
        return f"{TENANT_ROLE}.{token(rest)}"
    return token(owner)


def tool_execute(tool: str) -> str:
    return f"{TOOL_EXECUTE_PREFIX}.{token(tool)}"


def run_event(kind: str) -> str:
    return f"{RUN_EVENT_PREFIX}.{token(kind)}"


def tool_succeeded(tool: str) -> str:
    return f"{TOOL_SUCCEEDED_PREFIX}.{token(tool)}"


def tool_attempt(tool: str) -> str:
    return f"{TOOL_ATTEMPT_PREFIX}.{token(tool)}"


def failure(failure_type: FailureType, tool: str | None) -> str:
    return f"{FAILURE_PREFIX}.{token(failure_type)}.{token(tool or '_')}"


def budget_event(level: str) -> str:
    return f"{BUDGET_EVENT_PREFIX}.{token(level)}"


def dead_letter(service: str) -> str:
    return f"{DLQ_PREFIX}.{token(service)}"


def payload_subject(user: str, digest: str, chunk: int) -> str:
    """Where chunk ``chunk`` of a body stored by ``user`` lives (``shared/payloads.py``)."""
    return f"{PAYLOAD_PREFIX}.{payload_owner(user)}.{token(digest)}.{chunk}"


def stream_for(subject: str) -> str | None:
    """The stream whose subjects hold ``subject`` (a subject, or a pattern one stream's subjects cover);
    None for a subject no stream holds (request/reply).

    Asked on every publish (``wire.landed_where_expected``), most of them subjects that carry a run id, each new:
    the streams' subjects are looked up as exact names and ``<prefix>.>`` prefixes, not matched pattern by
    pattern (no two streams' subjects overlap, so the first found is the only one)."""
    found = _EXACT_STREAM.get(subject)
    if found is not None:
        return found
    for prefix, stream in _PREFIX_STREAMS:
        if subject.startswith(prefix):
            return stream
    for pattern, stream in _PATTERN_STREAMS:
        if matches(pattern, subject):
            return stream
    return None


def _streams_by_form() -> tuple[dict[str, str], list[tuple[str, str]], list[tuple[str, str]]]:
    """``STREAM_SUBJECTS`` as exact subjects (each pattern itself too), ``<prefix>.>`` prefixes (the prefix with
    its dot) and any other pattern."""
    exact: dict[str, str] = {}
    prefixes: list[tuple[str, str]] = []
    others: list[tuple[str, str]] = []
    for stream, patterns in STREAM_SUBJECTS.items():
        for pattern in patterns:
            exact[pattern] = stream
            *head, last = pattern.split(".")
            if "*" in head or ">" in head or last == "*":
                others.append((pattern, stream))
            elif last == ">":
                prefixes.append((pattern[:-1], stream))
    return exact, prefixes, others


_EXACT_STREAM, _PREFIX_STREAMS, _PATTERN_STREAMS = _streams_by_form()


def matches(pattern: str, subject: str) -> bool:
    """Whether ``subject`` matches the NATS subject ``pattern`` (``*`` one token, ``>`` the rest)."""
    want, got = pattern.split("."), subject.split(".")
    for i, part in enumerate(want):
        if part == ">":
            return len(got) > i
        if i >= len(got) or (part != "*" and part != got[i]):
            return False
    return len(got) == len(want)


# --- the human queue's identity-bearing subjects (appended with the console) -----------------
# ``<verb>.<operator>``: the operator's own NATS user may publish only its own; the console's
# user may publish ``<verb>.console.<operator>`` for the operator logged in to it.
ESCALATION_RPC_PREFIX = f"{P}.rpc.escalation"
ESCALATION_SHOW = f"{ESCALATION_RPC_PREFIX}.show"
ESCALATION_VERBS = ("claim", "renew", "resolve")
ESCALATION_RENEWED = f"{ESCALATION_EVENT_PREFIX}.renewed"
ESCALATION_EXPIRED = f"{ESCALATION_EVENT_PREFIX}.expired"
ESCALATION_REFUSED = f"{ESCALATION_EVENT_PREFIX}.refused"
ESCALATION_SLA_APPLIED = f"{ESCALATION_EVENT_PREFIX}.sla_applied"


def escalation_rpc(verb: str, operator: str, via: str | None = None) -> str:
    """The subject an operator (or the console on their behalf) sends a claim/renew/resolve to."""
    return f"{ESCALATION_RPC_PREFIX}.{token(verb)}." + (f"{token(via)}." if via else "") + token(operator)


def mcp_server_event(server: str) -> str:
    return f"{MCP_SERVER_EVENT_PREFIX}.{token(server)}"


# --- the run id as the last token of every event that belongs to a run -----------------------
# ``lw.v1.evt.<area>.<verb>[.<tool>].<run>``: reading or watching one run is a server-side subject
# filter (``run_filters``) that delivers that run's events only, whatever else the stream holds.
# The bus appends the token when it publishes (``run_scoped``), so every builder above stays the
# subject's stem and routing by stem still works with a trailing wildcard, e.g.
# ``lw.v1.evt.failure.transient.search.*`` or ``lw.v1.evt.failure.fatal.>``. Events that belong to
# no run (an MCP server's status) keep their stem; a run event published without a run id gets ``_``.
EVENT_PREFIX = f"{P}.evt"
NO_RUN = "_"
NOT_RUN_SCOPED = (MCP_SERVER_EVENT_PREFIX,)
RUN_EVENT_DEPTHS = (6, 7)  # tokens in a run-scoped event subject: <area>.<verb>.<run> or <area>.<verb>.<tool>.<run>


def is_run_scoped(subject: str) -> bool:
    """Whether an event published on the stem ``subject`` gets the run id as its last token."""
    return subject.startswith(EVENT_PREFIX + ".") and not any(
        subject == p or subject.startswith(p + ".") for p in NOT_RUN_SCOPED
    )


def run_scoped(subject: str, run_id: str | None) -> str:
    """The subject an event is published on: its stem, then the run id (``_`` for none)."""
    return f"{subject}.{token(run_id or NO_RUN)}" if is_run_scoped(subject) else subject


def as_sent(subject: str) -> str:
    """A subject as its publisher sent it: a submit stored under its partition of the door
    (``...submit.<partition>.<tenant>``, ``SUBMIT_TRANSFORM``) -> ``...submit.<tenant>``; any other as it is."""
    if subject.startswith(RUN_SUBMIT_PREFIX + "."):
        partition, _, tenant = subject[len(RUN_SUBMIT_PREFIX) + 1 :].partition(".")
        if tenant and "." not in tenant and partition.isdigit() and int(partition) < SUBMIT_PARTITIONS:
            return f"{RUN_SUBMIT_PREFIX}.{tenant}"
    return subject


def stem(subject: str) -> str:
    """The subject without its run token (``lw.v1.evt.run.completed.<run>`` -> ``...run.completed``), and a
    submit as its client sent it (``...submit.<partition>.<tenant>`` -> ``...submit.<tenant>``)."""
    if subject.startswith(RUN_SUBMIT_PREFIX + "."):
        return as_sent(subject)
    return (
        subject.rsplit(".", 1)[0] if is_run_scoped(subject) and subject.count(".") + 1 in RUN_EVENT_DEPTHS else subject
    )


def run_filters(run_id: str, pattern: str = f"{EVENT_PREFIX}.>") -> list[str]:
    """Server-side filters for one run's events on stems matching ``pattern``: an exact stem or
    a ``*`` pattern gets the run token appended; ``<prefix>.>`` becomes one filter per subject
    depth (they never overlap, so one consumer can carry them all)."""
    run = token(run_id)
    if not pattern.endswith(".>"):
        return [f"{pattern}.{run}"]
    base = pattern[: -len(".>")]
    depth = base.count(".") + 1
    return [base + ".*" * (d - 1 - depth) + f".{run}" for d in RUN_EVENT_DEPTHS if d - 1 > depth]


def any_run(subject: str) -> str:
    """A filter for one event stem across every run (``lw.v1.evt.judge.verdict.*``)."""
    return f"{subject}.*"
