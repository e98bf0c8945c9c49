"""The one settings object every service and the CLI read (env prefix ``LW_``).

A bad value stops the process at start with the setting's environment name, so an
operator sees ``LW_MAX_ITERATIONS`` rather than a traceback from deep inside a handler.
"""

from __future__ import annotations

import json
import re
import sys
from functools import cached_property
from typing import Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.providers import ProviderName as Provider

ProviderName = Literal["auto"] | Provider  # auto: the first live provider whose key is set, else scripted
NotJudgedPolicy = Literal["escalate", "retry", "accept", "fail"]
LoopPolicy = Literal["stop", "escalate"]
FaultPoint = Literal[
    "after_start_recorded",
    "after_side_effect",
    "after_final_recorded",
    "after_final_published",
    "after_run_saved",  # the planner: a run's record is saved, nothing of it published or appended yet
    "after_model_answered",  # the planner: a turn's new model answer is stored, the run's record not yet saved
]


# The most a submit may set each per-run limit to (``LW_RUN_LIMIT_CAPS`` overrides): finite, so no client
# buys a run without end; a deployment sets them to what its tenants pay for.
RUN_LIMIT_CAPS: dict[str, float] = {
    "max_iterations": 500,
    "max_judge_retries": 20,
    "max_schema_corrections": 20,
    "cost_ceiling_usd": 10_000.0,
    "run_token_budget": 100_000_000,
    "context_budget_tokens": 10_000_000,
    "loop_repeat_threshold": 1000,
}
# The largest body a service reads per message type (``LW_BODY_MAX_BYTES`` overrides): a submit is a task
# (at most 100 KB) and a scenario; a tool's result may be as large as LW_TOOL_OUTPUT_MAX_BYTES allows.
BODY_MAX_BYTES: dict[str, int] = {"RunSubmit": 5 * 1024 * 1024, "*": 64 * 1024 * 1024}


class McpServerSpec(BaseModel):
    """One MCP server the executor mounts over stdio (an item of ``LW_MCP_SERVERS``)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9_-]+$")
    command: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    tools: list[str] | None = Field(None, description="mount only these tools")
    prefix: str = Field("", description="prefix for the mounted tool names")
    output_schemas: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="outputSchema for tools whose server declares none (their text is then parsed as JSON); "
        "without one, a tool's content reaches the model as text",
    )
    repairs: dict[str, list[dict[str, str]]] = Field(default_factory=dict)
    timeout_s: float = Field(10.0, gt=0)
    # --- added for issue 14 (services/executor/mcp_tools.py) ---------------------------------
    start_timeout_s: float = Field(30.0, gt=0, description="spawn + handshake + tool list, per server")
    restart_base_s: float = Field(0.5, ge=0, description="first restart delay of a dead server; doubles")
    restart_max_s: float = Field(30.0, gt=0, description="longest delay between restarts")
    closed_output_schemas: bool = Field(
        False,
        description="close the server's declared outputSchemas (additionalProperties: false); the default "
        "keeps them as written, so a server that adds an output field keeps working",
    )
    idempotent: dict[str, bool] = Field(
        default_factory=dict, description="tool -> idempotent, overriding the server's annotations"
    )
    max_result_chars: int = Field(100_000, ge=100, description="a longer text result is cut (with a note)")


_DURATION = re.compile(r"^(\d+)(ms|s|m|h)$")
_DURATION_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}


def sync_interval(value: str) -> str:
    """``LW_NATS_SYNC_INTERVAL`` as nats-server's ``sync_interval`` reads it: ``always``, or a duration in
    seconds or milliseconds (in a nats config a bare ``2m`` is the number 2,000,000, not two minutes)."""
    text = value.strip().lower()
    if text == "always":
        return text
    match = _DURATION.match(text)
    if match is None or int(match.group(1)) == 0:
        raise ValueError(f"{value!r} is neither 'always' nor a duration such as 500ms, 1s, 2m or 1h")
    seconds = int(match.group(1)) * _DURATION_S[match.group(2)]
    return f"{match.group(1)}ms" if match.group(2) == "ms" else f"{int(seconds)}s"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LW_", extra="ignore", frozen=True)

    # --- bus -------------------------------------------------------------------------
    nats_url: str = Field("nats://127.0.0.1:4222", validation_alias=AliasChoices("LW_NATS_URL", "NATS_URL"))
    nats_sync_interval: str | None = Field(
        None,
        description="JetStream's fsync, written into the nats-server config loopwarden starts or ships: 'always' "
        "(every write is on disk before its ack: survives a power loss) or a duration such as 1s or 2m (acked "
        "writes since the last sync survive a process crash, not a power loss); unset: the server's 2 minutes "
        "(docs/operations.md, Durability)",
    )
    nats_user: str | None = None
    nats_password: SecretStr | None = None
    ack_wait_s: float = Field(
        30.0,
        gt=0,
        description="JetStream ack wait; handlers heartbeat at a third of it, and a handler whose dependency is not "
        "ready (the governor restarting) retries in place until it has passed since the delivery, then hands it back",
    )
    max_deliver: int = Field(
        6,
        ge=2,
        description="deliveries before a message is dead-lettered (a crash or hang each; an outage one per ack wait; "
        "a wait on a replica that shows it is alive, such as a tool call another executor runs, none)",
    )
    redeliver_delay_s: float = Field(0.5, ge=0, description="first nack delay; doubles per delivery")
    duplicate_window_s: float = Field(
        600.0,
        gt=0,
        description="JetStream de-duplication window of LW_SUBMIT: what a client or an operator may send again "
        "(a submit, a requeue)",
    )
    redelivery_window_s: float | None = Field(
        None,
        gt=0,
        description="de-duplication window of LW_CMD, LW_EVT and LW_DLQ, whose messages are published again only "
        "by a redelivered handler: default the delivery budget (max_deliver ack waits and the nak backoffs between "
        "them), at least 120 s. nats-server holds every message id of the window in memory",
    )
    tool_lease_s: float = Field(
        10.0,
        gt=0,
        description="an executor's lease on a tool call it runs (renewed at a fifth of it): another replica "
        "declares the call's outcome unknown only after seeing no renewal for this long",
    )
    stream_max_age_s: float = Field(7 * 24 * 3600.0, gt=0)
    rpc_timeout_s: float = Field(5.0, gt=0)
    manage_streams: bool = Field(
        True, description="create/update streams and buckets at start; off where an admin bootstraps them"
    )
    stream_replicas: int = Field(1, ge=1, le=5, description="JetStream replicas for streams and buckets")
    max_in_flight: int = Field(
        64, ge=1, le=10_000, description="messages a replica handles at once per durable consumer (I/O-bound work)"
    )
    max_in_flight_by_service: dict[str, PositiveInt] = Field(
        default_factory=dict, description='JSON: per-service override of LW_MAX_IN_FLIGHT, e.g. {"executor": 256}'
    )
    event_loop: Literal["uvloop", "asyncio"] = Field(
        "uvloop", description="a service's event loop: uvloop (libuv; less CPU per message) or the standard asyncio one"
    )
    max_ack_pending: int | None = Field(
        None, ge=1, description="unacked messages per durable across its replicas (default: 8 x max in flight)"
    )
    bucket_replicas: int | None = Field(
        None, ge=1, le=5, description="JetStream replicas for KV buckets (default: LW_STREAM_REPLICAS)"
    )
    failover_retry_s: float = Field(
        20.0, ge=0, description="how long a publish or KV request rides out a stream leader election"
    )
    js_timeout_s: float = Field(
        5.0, gt=0, description="how long one JetStream publish or KV request waits for its answer before a retry"
    )
    infra_wait_s: float = Field(
        0, ge=0, description="with LW_MANAGE_STREAMS=false: give up waiting for bootstrap after this long (0: never)"
    )
    stack_ready_timeout_s: float = Field(
        60.0,
        gt=0,
        description="how long a local stack (`loopwarden up`, `demo`, the test suite) waits for nats-server and "
        "every service to be ready before it stops what it started and fails",
    )

    # --- models ----------------------------------------------------------------------
    planner_provider: ProviderName = "auto"
    planner_model: str = "claude-sonnet-4-5"
    planner_max_output_tokens: int = Field(2048, ge=16)
    judge_provider: ProviderName = "auto"
    judge_model: str = "claude-haiku-4-5"
    judge_max_output_tokens: int = Field(500, ge=16)
    fallback_model: str | None = Field(
        "claude-haiku-4-5", description="cheaper model the governor switches to when the budget runs low"
    )
    anthropic_api_key: SecretStr | None = Field(
        None, validation_alias=AliasChoices("LW_ANTHROPIC_API_KEY", "ANTHROPIC_API_KEY")
    )
    anthropic_base_url: str | None = Field(
        None, validation_alias=AliasChoices("LW_ANTHROPIC_BASE_URL", "ANTHROPIC_BASE_URL")
    )
    # --- model providers per role (issue 27: shared/providers/select.py reads these) ----------
    openai_api_key: SecretStr | None = Field(None, validation_alias=AliasChoices("LW_OPENAI_API_KEY", "OPENAI_API_KEY"))
    openai_base_url: str | None = Field(
        None,
        validation_alias=AliasChoices("LW_OPENAI_BASE_URL", "OPENAI_BASE_URL"),
        description="an OpenAI-compatible server, e.g. http://localhost:11434/v1 (Ollama) or :8000/v1 (vLLM)",
    )
    planner_base_url: str | None = Field(None, description="the planner's provider endpoint (over the provider's)")
    planner_api_key: SecretStr | None = Field(None, description="the planner's provider key (over the provider's)")
    judge_base_url: str | None = Field(None, description="the judge's provider endpoint (over the provider's)")
    judge_api_key: SecretStr | None = Field(None, description="the judge's provider key (over the provider's)")
    undeclared_fields: Literal["refuse", "strip", "open"] = Field(
        "refuse",
        description="a tool call's input fields its schema does not declare: refuse the call (the model is told), "
        "strip them and run, or keep them (open); a tool's own x-loopwarden-undeclared wins",
    )
    model_timeout_s: float = Field(120.0, gt=0)
    model_retry_attempts: int = Field(4, ge=1, description="attempts per model call on transient errors")
    model_retry_base_s: float = Field(0.5, ge=0)
    model_retry_max_s: float = Field(20.0, gt=0)

    # --- run limits (defaults; a run submission may lower or raise them) -------------
    max_iterations: int = Field(15, ge=1)
    max_judge_retries: int = Field(2, ge=0)
    max_schema_corrections: int = Field(2, ge=0)
    cost_ceiling_usd: float = Field(0.50, gt=0)
    not_judged_policy: NotJudgedPolicy = "escalate"
    loop_window: int = Field(6, ge=2)
    loop_repeat_threshold: int = Field(3, ge=2)
    loop_policy: LoopPolicy = "stop"
    max_tool_result_tokens: int = Field(2000, ge=50, description="a larger tool result is truncated in context")

    # --- token budget (governor) -----------------------------------------------------
    context_budget_tokens: int = Field(60_000, ge=1000)
    run_token_budget: int = Field(400_000, ge=1000, description="input+output tokens per run")
    warn_at: float = Field(0.70, gt=0, lt=1)
    compact_at: float = Field(0.80, gt=0, lt=1, description="share of the history allocation")
    keep_recent_turns: int = Field(6, ge=1)
    budget_exhausted_policy: Literal["fallback_model", "stop"] = "fallback_model"

    # --- executor --------------------------------------------------------------------
    executor_tools: str = Field("*", description="comma list of tools this executor hosts, '*' for all")
    tool_contract_dir: str | None = Field(None, description="extra directory of JSON tool contracts")
    tool_modules: str | None = Field(
        None, description="comma list of Python tool modules (@tool) to import: installed dotted names or .py paths"
    )
    default_schema_dialect: Literal["draft-07", "2019-09", "2020-12"] = "2020-12"
    mcp_servers: str | None = Field(None, description="JSON list of MCP stdio servers to mount")
    boundaries: dict[str, Literal["skip_and_note", "use_cached", "ask_human"]] = Field(
        default_factory=dict,
        description='JSON: tool or group name -> error boundary, e.g. {"enrichment": "skip_and_note"}',
    )

    # --- escalation queue and console -------------------------------------------------
    escalation_lease_s: float = Field(300.0, gt=0, description="a claim expires unless renewed within this")
    escalation_sweep_s: float = Field(1.0, gt=0, description="how often leases and SLA deadlines are checked")
    escalation_context_turns: int = Field(6, ge=0, description="last turns of the run copied into a queue item")
    escalation_slas: str | None = Field(
        None,
        description='JSON: kind -> {"after_s": seconds, "action": abort|deny|accept_if_judged|fall_back}, '
        "over the defaults",
    )
    operators: str | None = Field(
        None, description='JSON: operator -> kinds they may act on, e.g. {"alice": ["*"], "bob": ["not_judged"]}'
    )
    console_host: str = "127.0.0.1"
    console_port: int = Field(8700, ge=0, le=65535)
    console_users: str | None = Field(None, description="JSON: operator -> bcrypt hash of their console password")
    console_secret: SecretStr | None = Field(
        None, description="signs console sessions; set the same value on every replica (default: random per process)"
    )
    console_session_s: float = Field(
        3600.0, gt=0, le=24 * 3600.0, description="how long a console login lasts (at most a day: revocations expire)"
    )
    console_public_url: str | None = Field(
        None,
        description="the console's address as browsers see it (behind a proxy): a form posted from any other "
        "origin is refused (default: the request's own scheme and Host)",
    )
    console_secure_cookie: bool = Field(
        False, description="mark the session cookie Secure (automatic when served over TLS or X-Forwarded-Proto https)"
    )
    console_passwords_file: str | None = Field(
        None, description="without LW_CONSOLE_USERS: write a fresh password per operator here (local stack)"
    )
    jaeger_url: str = Field("http://127.0.0.1:16686", description="Jaeger UI base; runs link to <url>/trace/<id>")

    # --- telemetry -------------------------------------------------------------------
    otel_exporter_otlp_endpoint: str | None = Field(
        None, validation_alias=AliasChoices("LW_OTEL_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    health_port: int | None = Field(
        None, ge=0, le=65535, description="serve /livez and /readyz on this port (probes; shared/health.py); unset: off"
    )
    health_host: str = Field("127.0.0.1", description="where the health endpoint listens (0.0.0.0 in containers)")

    # --- large payloads and fault injection (issue 9) ----------------------------------
    payload_inline_limit_bytes: int = Field(
        256 * 1024,
        ge=1024,
        description="a message body or KV value larger than this travels by reference (JetStream Object Store); "
        "capped below the server's max_payload",
    )
    payload_max_bytes: int = Field(
        8 * 1024**3,
        ge=1024 * 1024,
        description="the claim-check stream LW_PAYLOADS holds at most this many bytes (a new body is refused "
        "when it is full)",
    )
    tool_output_max_bytes: int = Field(
        16 * 1024 * 1024, ge=1024, description="a tool output above this is a failure the model sees, never retried"
    )
    run_state_result_max_bytes: int = Field(
        16 * 1024, ge=256, description="the planner keeps at most this much of one tool result in its run state"
    )
    fault_inject: FaultPoint | None = Field(
        None,
        description="TEST ONLY: the executor exits (os._exit) at this point of every tool call (the planner: "
        "after_run_saved, after saving a run's record; after_model_answered, after storing a turn's new model "
        "answer, before saving the record); unset in production",
    )
    # --- the command line (loopwarden) ---------------------------------------------------------
    state_dir: str | None = Field(
        None,
        description="where `loopwarden up` records the running stack and the demo keeps its logs (the same from "
        "any folder); default $XDG_STATE_HOME/loopwarden, else ~/.local/state/loopwarden",
    )
    cli_connect_timeout_s: float = Field(
        3.0, gt=0, description="how long a CLI command tries to reach NATS before it says so and exits 3"
    )

    # --- run records: retention and archive (issue 15) -----------------------------------
    retention_runs_s: float = Field(
        7 * 24 * 3600.0,
        ge=0,
        description="a finished run's records (state, events, model calls, ledger, verdicts, ...) are purged this "
        "long after it finished; a running run or one waiting on a human never expires",
    )
    retention_escalations_s: float = Field(
        30 * 24 * 3600.0, ge=0, description="resolved queue items and their events (the audit trail) are kept this long"
    )
    retention_sweep_s: float = Field(300.0, gt=0, description="how often `loopwarden retention` sweeps")
    evt_max_age_s: float = Field(
        0.0, ge=0, description="age limit of the event stream; 0 = none (finished runs' events leave by retention)"
    )
    archive_dir: str | None = Field(None, description="export every finished run to <dir>/<run>.json before it expires")
    archive_bucket: str | None = Field(
        None, description="export every finished run to this Object Store bucket before it expires"
    )

    # --- cost as the bill says it (issue 11) --------------------------------------------
    prompt_caching: bool = Field(True, description="send planner turns with prompt-cache breakpoints")
    more_room_output_tokens: int = Field(
        8192, ge=16, description="a reply cut off at max_tokens is asked once more with this many (at least 2x)"
    )
    compact_at_cached: float = Field(
        0.95,
        gt=0,
        lt=1,
        description="with a warm prompt cache, soft compaction waits until history reaches this share of its "
        "allocation (compaction re-writes the cached prefix at 1.25x what a cached turn reads at 0.1x)",
    )
    calibration_weight: float = Field(
        0.2, gt=0, le=1, description="weight of each new sample in the per-model estimate/reported token ratio"
    )
    tenant_daily_ceiling_usd: float | None = Field(
        None, gt=0, description="daily cost ceiling of every tenant (None: no tenant ceiling)"
    )
    tenant_ceilings: dict[str, float] = Field(
        default_factory=dict, description='JSON: tenant -> daily cost ceiling in USD, e.g. {"acme": 25}'
    )
    wrap_up_reserve_usd: float = Field(
        0.0,
        ge=0,
        description="cost kept back from the ceiling for the wrap-up: a normal turn must leave this much "
        "(the wrap-up itself must fit what is left, its reply capped at LW_WRAP_UP_OUTPUT_TOKENS)",
    )
    wrap_up_output_tokens: int = Field(1024, ge=16, description="room for the wrap-up turn's final answer")
    delegate_max_depth: int = Field(2, ge=0, description="how deep sub-agents may nest (0: no delegation)")
    delegate_max_children: int = Field(4, ge=1, description="sub-agent runs one run may start")
    delegate_ceiling_usd: float = Field(0.10, gt=0, description="a sub-agent's cost ceiling unless it asks for less")
    delegate_max_iterations: int = Field(6, ge=1, description="a sub-agent's iteration cap unless it asks for less")
    spawn_gate_usd: float = Field(
        0.10, ge=0, description="a sub-agent whose estimated cost is above this waits for a human's approval"
    )
    tool_host_grace_s: float = Field(
        15.0,
        ge=0,
        description="a called tool no running executor pulls is asked about again this long before the call is an "
        "unknown_tool failure (a replica restarting is back within it and its calls wait in the stream)",
    )
    progressive_tools_above: int | None = Field(
        20, ge=1, description="above this many offered tools the model sees one line per tool; None: always full"
    )

    # --- what a run accepts (issue 23) --------------------------------------------------------------
    allow_scripted: bool = Field(
        True,
        description="runs submitted with a scenario are replayed (the model's turns and the tools' behaviour "
        "scripted): true for the local stack, tests and the demo; false in a deployment, where such a submit is "
        "refused and no service applies a stored scenario",
    )
    tenant: str = Field(
        "default",
        pattern=r"^[A-Za-z0-9_-]{1,64}$",
        description="the client: the tenant it submits runs for (its NATS user may submit only that tenant's)",
    )
    run_limit_caps: dict[str, float] = Field(
        default_factory=lambda: dict(RUN_LIMIT_CAPS),
        description="JSON: the most a submit may set each per-run limit to (RunSubmit.limits); over it, refused",
    )
    scenario_max_bytes: int = Field(
        4 * 1024 * 1024, ge=1024, description="the largest scenario a submit may carry (its canonical JSON)"
    )
    body_max_bytes: dict[str, int] = Field(
        default_factory=lambda: dict(BODY_MAX_BYTES),
        description="JSON: message type -> the largest body of that type a service reads (a body sent by "
        "reference over it is refused before it is fetched); '*' for every other type",
    )

    @field_validator("nats_url")
    @classmethod
    def _nats_scheme(cls, v: str) -> str:
        for url in v.split(","):
            if not url.strip().startswith(("nats://", "tls://", "ws://", "wss://")):
                raise ValueError(f"must start with nats://, tls://, ws:// or wss:// (got {url!r})")
        return v

    @field_validator("mcp_servers")
    @classmethod
    def _mcp_servers(cls, v: str | None) -> str | None:
        if v:
            try:
                data = json.loads(v)
            except json.JSONDecodeError as err:
                raise ValueError(f"not JSON: {err.msg} at column {err.colno}") from None
            if not isinstance(data, list):
                raise ValueError("must be a JSON list of servers")
            for i, item in enumerate(data):
                try:
                    McpServerSpec.model_validate(item)
                except ValidationError as err:
                    first = err.errors()[0]
                    where = ".".join(str(p) for p in first["loc"])
                    raise ValueError(f"server #{i}: {where}: {first['msg']}") from None
            names = [item["name"] for item in data]
            if len(set(names)) != len(names):  # a server's status and events are keyed by its name
                raise ValueError(
                    f"server names must be unique; repeated: {sorted({n for n in names if names.count(n) > 1})}"
                )
        return v

    @field_validator("escalation_slas")
    @classmethod
    def _slas(cls, v: str | None) -> str | None:
        if v:
            from typing import get_args

            from shared.messages import EscalationKind, SlaAction

            data = _json_object(v)
            for kind, rule in data.items():
                if kind not in get_args(EscalationKind):
                    raise ValueError(f"unknown kind {kind!r} (kinds: {', '.join(get_args(EscalationKind))})")
                if not isinstance(rule, dict) or set(rule) - {"after_s", "action"}:
                    raise ValueError(f"{kind}: must be {{'after_s': seconds, 'action': ...}}")
                after = rule.get("after_s", 1)
                if not isinstance(after, int | float) or after <= 0:
                    raise ValueError(f"{kind}.after_s must be a number above 0")
                if "action" in rule and rule["action"] not in get_args(SlaAction):
                    raise ValueError(f"{kind}.action must be one of {', '.join(get_args(SlaAction))}")
        return v

    @field_validator("operators", "console_users")
    @classmethod
    def _name_map(cls, v: str | None) -> str | None:
        if v:
            for name, value in _json_object(v).items():
                if not re.fullmatch(r"[A-Za-z0-9_-]+", name) or name in ("console", "sla"):
                    raise ValueError(f"operator name {name!r}: letters, digits, '-' and '_' only; not console/sla")
                if not isinstance(value, list | str):
                    raise ValueError(f"{name}: expected a list of kinds or a bcrypt hash")
        return v

    @field_validator("nats_sync_interval")
    @classmethod
    def _sync_interval(cls, v: str | None) -> str | None:
        return None if v is None else sync_interval(v)

    @field_validator("executor_tools")
    @classmethod
    def _tools_list(cls, v: str) -> str:
        names = [t.strip() for t in v.split(",") if t.strip()]
        if not names:
            raise ValueError("must name at least one tool, or '*'")
        return v

    @field_validator("tenant_ceilings")
    @classmethod
    def _tenant_ceilings(cls, v: dict[str, float]) -> dict[str, float]:
        for tenant, ceiling in v.items():
            if ceiling <= 0:
                raise ValueError(f"{tenant}: a daily ceiling must be above 0 (got {ceiling})")
        return v

    @field_validator("run_limit_caps")
    @classmethod
    def _run_limit_caps(cls, v: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(v) - set(RUN_LIMIT_CAPS))
        if unknown:
            raise ValueError(f"not per-run limits: {', '.join(unknown)} (known: {', '.join(RUN_LIMIT_CAPS)})")
        return {**RUN_LIMIT_CAPS, **v}

    @field_validator("body_max_bytes")
    @classmethod
    def _body_max_bytes(cls, v: dict[str, int]) -> dict[str, int]:
        for name, size in v.items():
            if size < 1024:
                raise ValueError(f"{name}: a body limit must be at least 1024 bytes (got {size})")
        return {**BODY_MAX_BYTES, **v}

    @model_validator(mode="after")
    def _thresholds_ordered(self) -> Settings:
        if self.warn_at >= 1.0 or self.compact_at >= 1.0:
            raise ValueError("thresholds must be below 1.0")
        return self

    # --- derived ---------------------------------------------------------------------
    def body_limit(self, message_type: str) -> int:
        """The largest body of ``message_type`` a service reads (``LW_BODY_MAX_BYTES``)."""
        return self.body_max_bytes.get(message_type, self.body_max_bytes["*"])

    @property
    def delivery_budget_s(self) -> float:
        """How long after its first delivery a message can still be handled (and what it publishes published
        again): ``max_deliver`` ack waits and the doubling nak delays between them."""
        naks = self.redeliver_delay_s * ((1 << (self.max_deliver - 1)) - 1)
        return self.max_deliver * self.ack_wait_s + naks

    @property
    def redelivery_dedupe_s(self) -> float:
        """The de-duplication window of the streams only redeliveries publish to again."""
        return self.redelivery_window_s or max(120.0, self.delivery_budget_s)

    @cached_property
    def hosted_tools(self) -> frozenset[str] | None:
        """Tools this executor hosts; ``None`` means every registered tool."""
        names = {t.strip() for t in self.executor_tools.split(",") if t.strip()}
        return None if "*" in names else frozenset(names)

    @property
    def kv_replicas(self) -> int:
        """Replicas of a KV bucket: ``LW_BUCKET_REPLICAS``, else ``LW_STREAM_REPLICAS``."""
        return self.bucket_replicas or self.stream_replicas

    @property
    def mcp_server_specs(self) -> list[McpServerSpec]:
        return [McpServerSpec.model_validate(x) for x in json.loads(self.mcp_servers)] if self.mcp_servers else []

    def in_flight_for(self, service: str) -> int:
        """How many messages one replica of ``service`` handles at once."""
        return max(1, self.max_in_flight_by_service.get(service, self.max_in_flight))

    def ack_pending_for(self, service: str) -> int:
        """A durable's ``max_ack_pending``: room for up to eight replicas each at full concurrency."""
        return self.max_ack_pending or 8 * self.in_flight_for(service)


def _json_object(v: str) -> dict[str, Any]:
    try:
        data = json.loads(v)
    except json.JSONDecodeError as err:
        raise ValueError(f"not JSON: {err.msg} at column {err.colno}") from None
    if not isinstance(data, dict):
        raise ValueError("must be a JSON object")
    return data


def env_name(field: str) -> str:
    """The environment variable an operator sets for ``field``."""
    info = Settings.model_fields.get(field)
    alias = info.validation_alias if info else None
    if isinstance(alias, AliasChoices):
        return " or ".join(str(c) for c in alias.choices)
    return f"LW_{field.upper()}"


class SettingsError(SystemExit):
    """Raised (as a clean exit) when configuration is invalid."""


def describe_settings_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        field = str(e["loc"][0]) if e["loc"] else "settings"
        got = e.get("input")
        shown = "" if isinstance(got, dict) else f" (got {got!r})"
        lines.append(f"invalid setting {env_name(field)}: {e['msg']}{shown}")
    return "\n".join(lines)


def load_settings(service: str = "loopwarden", **overrides: object) -> Settings:
    """Read settings from the environment, or stop the process naming the bad setting."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as err:
        print(f"{service}: {describe_settings_error(err)}", file=sys.stderr)
        raise SettingsError(2) from None
