"""Choose a provider for a run: the planner's and the judge's are configured separately.

The one place that knows which runs are scripted: a run submitted with a scenario (bound by the
planner at submit) is replayed by the scripted provider, and its scenario's tool behaviour applies
to its tool calls. Services ask ``run_provider`` / ``scripted_tools`` for the run; no message says
whether a run is scripted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from shared.providers.anthropic import AnthropicProvider
from shared.providers.base import ModelProvider, ProviderError
from shared.providers.scripted import ScriptedProvider
from shared.scenario import Scenario
from shared.settings import Settings

if TYPE_CHECKING:
    from shared.bus import Bus


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


async def run_provider(bus: Bus, settings: Settings, which: Literal["planner", "judge"], run_id: str) -> ModelProvider:
    """The provider serving ``run_id``: ``provider_for`` with the scenario bound to the run, if any.
    A storage error reading the binding is raised (the caller's message is redelivered)."""
    pinned = (settings.planner_provider if which == "planner" else settings.judge_provider) == "anthropic"
    scripted = settings.allow_scripted and not pinned
    return provider_for(settings, which, await bus.scenario(run_id) if scripted else None)


async def scripted_tools(bus: Bus, settings: Settings, run_id: str) -> Scenario | None:
    """The scenario whose tool behaviour applies to ``run_id``'s tool calls: only a run submitted with one
    and replayed as scripted (a live run never consults a scenario: the planner removes one stored before a
    live run starts), so none where scripted runs are not allowed or the planner is pinned to a live model."""
    if not settings.allow_scripted or settings.planner_provider == "anthropic":
        return None
    return await bus.scenario(run_id)
