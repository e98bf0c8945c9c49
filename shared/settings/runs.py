"""What a run is allowed: its limits and their caps, its token and cost budget, what a submit may carry."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, Field, field_validator, model_validator

NotJudgedPolicy = Literal["escalate", "retry", "accept", "fail"]
LoopPolicy = Literal["stop", "escalate"]

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
    "max_rate_limit_wait_s": 3600.0,
}
KIB, MIB = 1024, 1024 * 1024
# The largest body a service reads per message type (``LW_BODY_MAX_BYTES`` overrides an entry), near what the
# type really carries: a body over it is refused unread (by reference: before a chunk of it is fetched). Every
# type a service consumes or answers has its row (``tests/unit/test_body_limits.py``); ``*`` is for the rest.
BODY_MAX_BYTES: dict[str, int] = {
    "RunSubmit": 5 * MIB,  # a task (at most 100,000 characters) and a scenario (LW_SCENARIO_MAX_BYTES)
    "RunAdvance": 4 * KIB,  # a run id and a turn
    "Requeue": 4 * KIB,  # a letter's number
    "RunRead": 2 * KIB,  # a run id, a filter and a key of at most 256 characters each, a bucket, three numbers
    "RunQuery": 2 * KIB,  # a tenant's listing: a status, an agent, three numbers
    "FlowQuery": 1 * KIB,  # the fleet's view: a tenant name at most
    "EscalationQuery": 2 * KIB,
    "EscalationClaim": 2 * KIB,
    "BudgetRequest": 8 * KIB,  # token counts and usage
    "LetterHandled": 4 * KIB,
    "ToolCall": 2 * MIB,  # arguments a model wrote (a turn's output is far below this)
    "JudgeRequest": 4 * MIB,  # the task, a candidate answer, the rubric
    "Verdict": 1 * MIB,
    "EscalationRaise": 1 * MIB,  # arguments, the error the model read (bounded in the run state), a candidate
    "DeadLetter": 1 * MIB,  # a letter keeps at most 256 KiB of its message's body
    "RunEvent": 4 * MIB,  # a final answer (the governor reads the run's final event)
    "AgentRegister": 1 * MIB,  # an agent: 20,000 characters of instructions, at most 1,024 tools and tenants
    "*": 1 * MIB,
}
# Types that carry a tool's output (or a person's result in its place): LW_TOOL_OUTPUT_MAX_BYTES and room for
# the call's arguments, unless LW_BODY_MAX_BYTES names them.
TOOL_SIZED = ("ToolResultRaw", "ToolOutcome", "EscalationWithdraw", "EscalationResolve", "EscalationResolution")
TOOL_SIZED_ROOM = 2 * MIB


def body_limit(limits: dict[str, int], message_type: str, tool_output_max_bytes: int) -> int:
    """The largest body of ``message_type`` a service reads: its entry in ``limits`` (``LW_BODY_MAX_BYTES``),
    a tool output's size for the types that carry one, else the ``*`` entry."""
    if message_type in limits:
        return limits[message_type]
    if message_type in TOOL_SIZED:
        return tool_output_max_bytes + TOOL_SIZED_ROOM
    return limits["*"]


class RunSettings(BaseModel):
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
    budget_lease_turns: int = Field(
        8,
        ge=0,
        le=64,
        description="an allow may cover this many later turns of the run (a lease): the planner takes them without "
        "asking while the run stays inside bounds the governor checked against its rule; a tenant with a daily "
        "ceiling gets none (0: every turn asks)",
    )
    budget_lease_s: float = Field(
        5.0,
        gt=0,
        le=600,
        description="how long a lease lasts: a turn after it asks (a tenant's new ceiling or a calibration learned "
        "meanwhile applies to a leased run within this)",
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
        "reference over it is refused before it is fetched), over the defaults; '*' for every other type (the "
        "types that carry a tool's output: LW_TOOL_OUTPUT_MAX_BYTES and 2 MiB, unless named)",
    )

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
    def _thresholds_ordered(self) -> Self:
        if self.warn_at >= 1.0 or self.compact_at >= 1.0:
            raise ValueError("thresholds must be below 1.0")
        return self
