"""The model providers: which one serves each role, with which model, and how a call is retried."""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, BaseModel, Field, SecretStr

from shared.providers import ProviderName as Provider

ProviderName = Literal["auto"] | Provider  # auto: the first live provider whose key is set, else scripted


class ModelSettings(BaseModel):
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
