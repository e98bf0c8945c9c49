"""Choose a provider for a run: the planner's and the judge's are configured separately."""

from __future__ import annotations

from typing import Literal

from shared.providers.anthropic import AnthropicProvider
from shared.providers.base import ModelProvider, ProviderError
from shared.providers.scripted import ScriptedProvider
from shared.scenario import Scenario
from shared.settings import Settings


def provider_for(settings: Settings, which: Literal["planner", "judge"], scenario: Scenario | None) -> ModelProvider:
    """The run's provider. A run submitted with a scenario is replayed by the scripted
    provider unless the service is pinned to ``anthropic``."""
    chosen = settings.resolved_provider(which)
    explicit = settings.planner_provider if which == "planner" else settings.judge_provider
    if scenario is not None and explicit != "anthropic":
        return ScriptedProvider(scenario, settings.prompt_caching)
    if chosen == "anthropic":
        if settings.anthropic_api_key is None:
            raise ProviderError(
                f"{which} provider is anthropic but ANTHROPIC_API_KEY is not set", transient=False, kind="config"
            )
        return AnthropicProvider(
            settings.anthropic_api_key.get_secret_value(),
            settings.anthropic_base_url,
            settings.model_timeout_s,
            prompt_caching=settings.prompt_caching,
        )
    if scenario is None:
        raise ProviderError(
            f"{which} provider is scripted but this run has no scenario; submit one with --scenario or set "
            "ANTHROPIC_API_KEY",
            transient=False,
            kind="config",
        )
    return ScriptedProvider(scenario, settings.prompt_caching)
