"""The model providers: which one serves each role, with which model, and how a call is retried."""

from __future__ import annotations

import re
from typing import Literal, get_args

from pydantic import AliasChoices, BaseModel, Field, SecretStr, field_validator

from shared.providers import ProviderName as Provider
from shared.ratelimit.bucket import Configured

ProviderName = Literal["auto"] | Provider  # auto: the first live provider whose key is set, else scripted


class ModelSettings(BaseModel):
    # --- models ----------------------------------------------------------------------
    planner_provider: ProviderName = "auto"
    planner_model: str = "claude-sonnet-4-6"  # claude-sonnet-4-5 reached its end of life on 2026-11-30
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

    # --- the providers' rate limits, fleet-wide (issue 34; docs/rate-limits.md) --------------------------
    rate_limit_fleet: bool = Field(
        True,
        description="model calls wait for their provider key's capacity, shared by every replica (lw_ratelimits), "
        "and a 429 pauses the key for all of them; false: each call retries its own 429s with backoff",
    )
    rate_limits: dict[str, Configured] = Field(
        default_factory=dict,
        description="JSON: provider (or provider.account, one key) -> per-minute limits that cap what the answers "
        'announce, or replace it with "mode": "override", e.g. {"anthropic": {"requests": 50, "input_tokens": 30000}}',
    )
    rate_limit_max_wait_s: float = Field(
        600.0,
        gt=0,
        description="the longest one model call waits for its key's rate limit (a run may ask for less: "
        "limits.max_rate_limit_wait_s); a longer wait ends the turn with a typed reason",
    )
    rate_limit_notice_s: float = Field(
        1.0, ge=0, description="a rate-limit wait at least this long is shown on the run (event run.rate_limited)"
    )
    rate_limit_burst_s: float = Field(
        0.0,
        ge=0,
        le=60,
        description="how far ahead of the limit's pace calls may go at once (seconds of each limit): 0 paces them",
    )

    @field_validator("rate_limits")
    @classmethod
    def _rate_limits(cls, v: dict[str, Configured]) -> dict[str, Configured]:
        live = [p for p in get_args(Provider) if p != "scripted"]
        for key in v:
            provider, _, account = key.partition(".")
            if provider not in live or (account and not _ACCOUNT.match(account)):
                raise ValueError(
                    f"{key}: expected a live provider ({', '.join(live)}) or <provider>.<account> "
                    "(the 12-hex-digit account loopwarden fleet shows)"
                )
        return v

    def rate_limit_for(self, provider: str, account: str) -> Configured | None:
        """The configured limits of one key: its own entry, else its provider's."""
        return self.rate_limits.get(f"{provider}.{account}") or self.rate_limits.get(provider)


_ACCOUNT = re.compile(r"^[0-9a-f]{12}$")
