"""Every metric's name, in one place, and the small parts that keep recording them cheap and bounded.

The scheme (docs/observability.md): the OpenTelemetry GenAI semantic conventions where one exists
(``gen_ai.client.*``), otherwise ``loopwarden.<area>.<what>``. On ``/metrics`` (the SDK's Prometheus
reader) a name's dots become underscores, a counter ends in ``_total`` and a unit is a suffix
(``s`` -> ``_seconds``, ``By`` -> ``_bytes``, ``USD`` -> ``_USD``): ``prometheus_name`` says which.

Label sets are bounded: never a run id, a call id or free text. The values of the labels that grow with
configuration (tenant, agent, tool, subject, durable) go through :class:`Bounded`: each metric keeps at
most ``MAX_LABEL_VALUES`` distinct values of such a label per process, and reports any further one as
``OTHER``. The SDK's own cardinality limit (2,000 attribute sets per metric) stays behind it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from shared.subjects import stem

# --- GenAI semantic conventions (histograms, per model call: planner, judge) ------------------------------
GEN_AI_TOKEN_USAGE = "gen_ai.client.token.usage"
GEN_AI_OPERATION_DURATION = "gen_ai.client.operation.duration"

# --- runs (planner) -------------------------------------------------------------------------------------
RUNS_STARTED = "loopwarden.runs.started"  # counter {tenant, agent}
RUNS_FINISHED = "loopwarden.runs.finished"  # counter {status, tenant, agent}
RUN_DURATION = "loopwarden.run.duration"  # histogram, s {status, tenant, agent}: submit to final status
RUN_COST = "loopwarden.runs.cost"  # counter, USD {tenant, agent}: a finished run's billed cost
RUN_TOKENS = "loopwarden.runs.tokens"  # counter {tenant, agent, gen_ai.token.type}: a finished run's tokens
DECIDE_DECISIONS = "loopwarden.decide.decisions"  # counter {action, row}
TOOL_CORRECTIONS = "loopwarden.tool.corrections"  # counter {tool, outcome: recovered | escalated}
MODEL_COST = "loopwarden.model.cost"  # counter, USD: every billed model call

# --- tools (executor, validator; failures: whoever publishes one) ---------------------------------------
TOOL_ATTEMPTS = "loopwarden.tool.attempts"  # counter {tool, result: ok | <failure type>}
TOOL_DURATION = "loopwarden.tool.duration"  # histogram, s {tool, result}: one attempt of a call
TOOL_UNDECLARED = "loopwarden.tool.undeclared_fields"  # counter {tool, policy, outcome}
TOOL_OUTPUTS = "loopwarden.tool.outputs"  # counter {tool, result: valid | repaired | invalid | unparseable}
FAILURES = "loopwarden.failures"  # counter {failure.type, tool}: every failure event, counted once

# --- every service ------------------------------------------------------------------------------------------
SERVICE_READY = "loopwarden.service.ready"  # gauge: 1 connected and consuming (/readyz 200), 0 not

# --- the bus (every service) -----------------------------------------------------------------------------
REDELIVERIES = "loopwarden.bus.redeliveries"  # counter {durable, subject}: a message delivered again
DEAD_LETTERS = "loopwarden.dead_letters"  # counter {subject}: a message this service gave up on
CONSUMER_PENDING = "loopwarden.consumer.pending"  # gauge {stream, durable}: not yet delivered (the backlog)
CONSUMER_ACK_PENDING = "loopwarden.consumer.ack_pending"  # gauge {stream, durable}: delivered, not acked
CONSUMER_REDELIVERED = "loopwarden.consumer.redelivered"  # gauge {stream, durable}: delivered more than once, unacked
STORE_BYTES = "loopwarden.store.bytes"  # gauge, By {stream}
STORE_MESSAGES = "loopwarden.store.messages"  # gauge {stream}
STORE_MAX_BYTES = "loopwarden.store.max_bytes"  # gauge, By {stream}: its bound (only a bounded stream)
POLL_ERRORS = "loopwarden.metrics.poll_errors"  # counter {what: consumer | stream}: an info request failed

# --- judge, governor ---------------------------------------------------------------------------------------
JUDGE_VERDICTS = "loopwarden.judge.verdicts"  # counter {status}
BUDGET_DECISIONS = "loopwarden.budget.decisions"  # counter {action}
BUDGET_ESTIMATED_COST = "loopwarden.budget.estimated_cost"  # counter, USD {gen_ai.request.model}
BUDGET_LEASED_TURNS = "loopwarden.budget.leased_turns"  # counter (planner): turns taken on a decision's lease
TENANT_COST = "loopwarden.tenant.cost"  # counter, USD {tenant}: spend accounted to a tenant with a ceiling
TENANT_SPENT_TODAY = "loopwarden.tenant.spent_today"  # gauge, USD {tenant}: its UTC day so far
TENANT_DAILY_CEILING = "loopwarden.tenant.daily_ceiling"  # gauge, USD {tenant}: what it may spend per UTC day

# --- the human queue (escalation) ----------------------------------------------------------------------
ESCALATIONS_RAISED = "loopwarden.escalations.raised"  # counter {kind}
ESCALATIONS_REFUSED = "loopwarden.escalations.refused"  # counter {verb}
QUEUE_ITEMS = "loopwarden.queue.items"  # gauge {kind, status: open | claimed}: not resolved yet
QUEUE_OLDEST_AGE = "loopwarden.queue.oldest_age"  # gauge, s {kind}: the oldest unresolved item's age
QUEUE_PAST_SLA = "loopwarden.queue.past_sla"  # gauge {kind}: unresolved items past their SLA deadline
SLA_BREACHES = "loopwarden.queue.sla_breaches"  # counter {kind, action}: an SLA's default action applied

# --- the console ----------------------------------------------------------------------------------------
CONSOLE_LOGINS = "loopwarden.console.logins"  # counter {result: ok | failed | throttled}

# --- flow control (planner; docs/flow-control.md) and rate limits (issue 34) ------------------------------------
FLOW_ADMITTED = "loopwarden.flow.admitted"  # counter {tenant}: runs admitted to the fleet
FLOW_REFUSED = "loopwarden.flow.refused"  # counter {tenant, quota}: submits refused at the door
FLOW_FINISHED = "loopwarden.flow.finished"  # counter {tenant}: admitted runs that ended
FLOW_WAIT = "loopwarden.flow.wait"  # histogram, s {tenant}: a run's wait for its tenant's share
FLOW_RATE_LIMITED = "loopwarden.flow.rate_limited"  # histogram, s {tenant}: an ended run's waits for rate limits
# fleet-wide gauges: every planner replica reports the same figure (take one, not the sum)
FLOW_QUEUED = "loopwarden.flow.queued"  # gauge {tenant}: runs waiting for their tenant's share
FLOW_RUNNING = "loopwarden.flow.running"  # gauge {tenant}: runs in flight
FLOW_CAPACITY = "loopwarden.flow.capacity"  # gauge: runs the fleet admits at once
FLOW_QUOTA_USED = "loopwarden.flow.quota.used"  # gauge {tenant, quota}: a quota's figure as last seen at the door
FLOW_QUOTA_LIMIT = "loopwarden.flow.quota.limit"  # gauge {tenant, quota}: that quota's limit
RATELIMIT_WAIT = (
    "loopwarden.ratelimit.wait"  # histogram, s {gen_ai.provider.name, loopwarden.ratelimit.account, reason}
)
RATELIMIT_REJECTIONS = "loopwarden.ratelimit.rejections"  # counter {gen_ai.provider.name, ...account}: 429s
RATELIMIT_GAVE_UP = "loopwarden.ratelimit.gave_up"  # counter: calls that would have waited past the bound
RATELIMIT_REMAINING = "loopwarden.ratelimit.remaining"  # gauge: what the provider last announced is left
RATELIMIT_LIMIT = "loopwarden.ratelimit.limit"  # gauge: the per-minute limit in force
RATELIMIT_LATE = "loopwarden.ratelimit.late"  # counter: calls woken > 0.5 s after their slot, which took another
AWAITED = frozenset(  # the figures of a live provider's calls, and only of them
    {
        RATELIMIT_WAIT,
        RATELIMIT_REJECTIONS,
        RATELIMIT_GAVE_UP,
        RATELIMIT_REMAINING,
        RATELIMIT_LIMIT,
        RATELIMIT_LATE,
    }
)  # the scrape test lets these be absent from its stack's /metrics (its runs replay scenarios and call
# no live provider); tests/own/test_rate_limits.py checks the dashboard's rate-limit queries against its
# planners' /metrics

# --- histogram buckets ------------------------------------------------------------------------------------
# the GenAI semantic conventions' recommended boundaries (operation duration, token usage)
DURATION_BUCKETS_S = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864)
# a model call's wait for its provider key's rate limit: none, a pace of a few calls, a minute's limit, the bound
WAIT_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
# a run lasts from a second to hours (a human's answer)
RUN_BUCKETS_S = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 14400.0, 86400.0)

# --- labels ------------------------------------------------------------------------------------------------
MAX_LABEL_VALUES = 100  # distinct values of one configuration-bound label, per metric and process
MAX_LABEL_LENGTH = 100
OTHER = "_other"  # every value past the cap
NONE = "_none"  # no value (a run without a registered agent)

Kind = Literal["counter", "histogram", "gauge"]
UNIT_SUFFIX = {"s": "seconds", "By": "bytes", "USD": "USD", "1": ""}


def prometheus_name(name: str, kind: Kind, unit: str = "") -> str:
    """What ``/metrics`` calls ``name`` (the SDK's Prometheus reader's mapping: dots to underscores, the
    unit's suffix, ``_total`` on a counter). A histogram's series add ``_bucket``, ``_sum``, ``_count``."""
    base = name.replace(".", "_")
    suffix = UNIT_SUFFIX.get(unit, "")
    if suffix and not base.endswith("_" + suffix):
        base = f"{base}_{suffix}"
    return f"{base}_total" if kind == "counter" else base


class Bounded:
    """One label's values for one metric: the first ``limit`` distinct ones as they are, ``OTHER`` after."""

    __slots__ = ("limit", "seen")

    def __init__(self, limit: int = MAX_LABEL_VALUES) -> None:
        self.limit = limit
        self.seen: set[str] = set()

    def __call__(self, value: str | None) -> str:
        v = (value or NONE)[:MAX_LABEL_LENGTH]
        if v in self.seen:
            return v
        if len(self.seen) >= self.limit:
            return OTHER
        self.seen.add(v)
        return v


class BusMetrics:
    """What the bus counts where it happens: a message delivered again, a message given up on (per subject
    stem: an event's run token is cut off, ``shared.subjects.stem``)."""

    def __init__(self, meter: Meter) -> None:
        self._redeliveries = meter.create_counter(
            REDELIVERIES, description="messages delivered again (a handler failed, said try later, or its replica died)"
        )
        self._dead_letters = meter.create_counter(DEAD_LETTERS, description="messages this service gave up on")
        self._durables, self._subjects, self._letter_subjects = Bounded(), Bounded(), Bounded()

    def redelivered(self, durable: str | None, subject: str) -> None:
        self._redeliveries.add(1, {"durable": self._durables(durable), "subject": self._subjects(stem(subject))})

    def dead_lettered(self, subject: str) -> None:
        self._dead_letters.add(1, {"subject": self._letter_subjects(stem(subject))})


class RunMetrics:
    """A run's figures, recorded by the planner where the run is created and where it ends (once each)."""

    def __init__(self, meter: Meter) -> None:
        self._started = meter.create_counter(RUNS_STARTED, description="runs created, by tenant and agent")
        self._finished = meter.create_counter(RUNS_FINISHED, description="runs ended, by final status, tenant, agent")
        self._duration = meter.create_histogram(
            RUN_DURATION,
            unit="s",
            description="runs from submit to their final status",
            explicit_bucket_boundaries_advisory=RUN_BUCKETS_S,
        )
        self._cost = meter.create_counter(RUN_COST, unit="USD", description="what ended runs spent (their own calls)")
        self._tokens = meter.create_counter(RUN_TOKENS, description="tokens of ended runs (their own calls), by type")
        self._tenants, self._agents = Bounded(), Bounded()

    def _who(self, tenant: str | None, agent: str | None) -> dict[str, str]:
        return {"tenant": self._tenants(tenant), "agent": self._agents(agent)}

    def started(self, tenant: str | None, agent: str | None) -> None:
        self._started.add(1, self._who(tenant, agent))

    def finished(
        self,
        status: str,
        tenant: str | None,
        agent: str | None,
        *,
        seconds: float,
        cost_usd: float,
        input_tokens: int,
        output_tokens: int,
    ) -> None:
        who = self._who(tenant, agent)
        self._finished.add(1, {**who, "status": status})
        self._duration.record(max(0.0, seconds), {**who, "status": status})
        if cost_usd > 0:
            self._cost.add(cost_usd, who)
        if input_tokens > 0:
            self._tokens.add(input_tokens, {**who, "gen_ai.token.type": "input"})
        if output_tokens > 0:
            self._tokens.add(output_tokens, {**who, "gen_ai.token.type": "output"})


class _Table:
    """Values per label set, kept in the process and read at collection (an observable instrument's callback)."""

    values: dict[tuple[tuple[str, Any], ...], float]

    def observe(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(v, dict(row)) for row, v in list(self.values.items())]


class Gauges(_Table):
    """An observable gauge whose values are set where they are known (a background poll, an event) and read
    at collection: a scrape costs no I/O. ``replace`` swaps the whole table (a poll's rows)."""

    def __init__(self, meter: Meter, name: str, *, unit: str = "", description: str = "") -> None:
        self.values = {}
        meter.create_observable_gauge(name, callbacks=[self.observe], unit=unit, description=description)

    def set(self, attributes: Mapping[str, str], value: float) -> None:
        self.values[tuple(sorted(attributes.items()))] = value

    def replace(self, rows: Iterable[tuple[Mapping[str, str], float]]) -> None:
        self.values = {tuple(sorted(a.items())): v for a, v in rows}


class Tally(_Table):
    """A counter whose sums are kept in the process and read at collection (an observable counter): ``add``
    is a dict update, where the SDK's counter aggregates each call (~20 us on a step's path, every step, in
    every service). A scrape reads the same monotonic sum per label set a counter exports, under the same
    name and unit; past ``MAX_ROWS`` label sets a further one is counted in the overflow set, as the SDK's
    cardinality limit does."""

    MAX_ROWS = 2000
    OVERFLOW: tuple[tuple[str, Any], ...] = (("otel.metric.overflow", True),)

    def __init__(self, meter: Meter, name: str, *, unit: str = "", description: str = "") -> None:
        self.values = {}
        meter.create_observable_counter(name, callbacks=[self.observe], unit=unit, description=description)

    def add(self, amount: float, attributes: Mapping[str, Any] | None = None) -> None:
        if amount < 0:  # a counter only grows (the SDK drops a negative add too)
            return
        row = tuple(sorted(attributes.items())) if attributes else ()
        values = self.values
        if row not in values and len(values) >= self.MAX_ROWS:
            row = self.OVERFLOW
        values[row] = values.get(row, 0) + amount


def computed_gauge(
    meter: Meter,
    name: str,
    rows: Callable[[], Iterable[tuple[Mapping[str, str], float]]],
    *,
    unit: str = "",
    description: str = "",
) -> None:
    """An observable gauge whose rows are computed at collection from what the process holds in memory
    (``rows`` must not do I/O: a scrape calls it)."""

    def observe(options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(v, dict(a)) for a, v in rows()]

    meter.create_observable_gauge(name, callbacks=[observe], unit=unit, description=description)


# --- the catalogue: each metric's instrument, unit and the services that export it --------------------------
# (docs/observability.md lists them; tests check the docs, the alert rules and the dashboard against it)
EVERY = ("planner", "executor", "validator", "judge", "governor", "escalation")
CATALOGUE: dict[str, tuple[Kind, str, tuple[str, ...]]] = {
    GEN_AI_TOKEN_USAGE: ("histogram", "{token}", ("planner", "judge")),
    GEN_AI_OPERATION_DURATION: ("histogram", "s", ("planner", "judge")),
    RUNS_STARTED: ("counter", "", ("planner",)),
    RUNS_FINISHED: ("counter", "", ("planner",)),
    RUN_DURATION: ("histogram", "s", ("planner",)),
    RUN_COST: ("counter", "USD", ("planner",)),
    RUN_TOKENS: ("counter", "", ("planner",)),
    DECIDE_DECISIONS: ("counter", "", ("planner",)),
    TOOL_CORRECTIONS: ("counter", "", ("planner",)),
    MODEL_COST: ("counter", "USD", ("planner",)),
    TOOL_ATTEMPTS: ("counter", "", ("executor",)),
    TOOL_DURATION: ("histogram", "s", ("executor",)),
    TOOL_UNDECLARED: ("counter", "", ("executor",)),
    TOOL_OUTPUTS: ("counter", "", ("validator",)),
    FAILURES: ("counter", "", EVERY),
    SERVICE_READY: ("gauge", "", EVERY),
    REDELIVERIES: ("counter", "", EVERY),
    DEAD_LETTERS: ("counter", "", EVERY),
    CONSUMER_PENDING: ("gauge", "", EVERY),
    CONSUMER_ACK_PENDING: ("gauge", "", EVERY),
    CONSUMER_REDELIVERED: ("gauge", "", EVERY),
    STORE_BYTES: ("gauge", "By", EVERY),
    STORE_MESSAGES: ("gauge", "", EVERY),
    STORE_MAX_BYTES: ("gauge", "By", EVERY),
    POLL_ERRORS: ("counter", "", EVERY),
    JUDGE_VERDICTS: ("counter", "", ("judge",)),
    BUDGET_DECISIONS: ("counter", "", ("governor",)),
    BUDGET_ESTIMATED_COST: ("counter", "USD", ("governor",)),
    BUDGET_LEASED_TURNS: ("counter", "", ("planner",)),
    TENANT_COST: ("counter", "USD", ("governor",)),
    TENANT_SPENT_TODAY: ("gauge", "USD", ("governor",)),
    TENANT_DAILY_CEILING: ("gauge", "USD", ("governor",)),
    ESCALATIONS_RAISED: ("counter", "", ("escalation",)),
    ESCALATIONS_REFUSED: ("counter", "", ("escalation",)),
    QUEUE_ITEMS: ("gauge", "", ("escalation",)),
    QUEUE_OLDEST_AGE: ("gauge", "s", ("escalation",)),
    QUEUE_PAST_SLA: ("gauge", "", ("escalation",)),
    SLA_BREACHES: ("counter", "", ("escalation",)),
    CONSOLE_LOGINS: ("counter", "", ("console",)),
    FLOW_ADMITTED: ("counter", "", ("planner",)),
    FLOW_REFUSED: ("counter", "", ("planner",)),
    FLOW_FINISHED: ("counter", "", ("planner",)),
    FLOW_WAIT: ("histogram", "s", ("planner",)),
    FLOW_RATE_LIMITED: ("histogram", "s", ("planner",)),
    FLOW_QUEUED: ("gauge", "", ("planner",)),
    FLOW_RUNNING: ("gauge", "", ("planner",)),
    FLOW_CAPACITY: ("gauge", "", ("planner",)),
    FLOW_QUOTA_USED: ("gauge", "", ("planner",)),
    FLOW_QUOTA_LIMIT: ("gauge", "", ("planner",)),
    RATELIMIT_WAIT: ("histogram", "s", ("planner", "judge")),
    RATELIMIT_REJECTIONS: ("counter", "", ("planner", "judge")),
    RATELIMIT_GAVE_UP: ("counter", "", ("planner", "judge")),
    RATELIMIT_REMAINING: ("gauge", "", ("planner", "judge")),
    RATELIMIT_LIMIT: ("gauge", "", ("planner", "judge")),
    RATELIMIT_LATE: ("counter", "", ("planner", "judge")),
}


def exposition_names() -> dict[str, str]:
    """Each catalogued metric's name on ``/metrics`` -> its OpenTelemetry name."""
    return {prometheus_name(name, kind, unit): name for name, (kind, unit, _) in CATALOGUE.items()}
