"""Choose a provider for a run: the planner's and the judge's are configured separately.

``PROVIDERS`` is the registry: a provider is a name, whether it is *live* (a real model behind an
API, which a bound scenario does not replace) and how it is built from the settings for a role.
Adding a provider is a module plus a row here.

The one place that knows which runs are scripted: a run submitted with a scenario (bound by the
planner at submit) is replayed by the scripted provider, unless the role is pinned to a live
provider, and its scenario's tool behaviour applies to its tool calls. Services ask
``run_provider`` / ``scripted_tools`` for the run; no message says whether a run is scripted.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

from pydantic import SecretStr

from shared.providers import ProviderName
from shared.providers.base import ModelProvider, ProviderError
from shared.providers.scripted import ScriptedProvider
from shared.scenario import Scenario, bound_scenario
from shared.settings import Settings

if TYPE_CHECKING:
    from shared.bus import Bus

Role = Literal["planner", "judge"]


@dataclass(frozen=True)
class Endpoint:
    """Where a role's live provider is reached: the role's own setting over the provider's."""

    api_key: str | None
    base_url: str | None


@dataclass(frozen=True)
class ProviderEntry:
    live: bool  # a real model behind an API: a run's scenario does not replace it
    key_env: str  # the provider's key, named in errors and docs
    key: Callable[[Settings], SecretStr | None]
    base_url: Callable[[Settings], str | None]
    build: Callable[[Settings, Endpoint], ModelProvider] | None  # None: built from a scenario
    needs_key: bool = True  # an OpenAI-compatible local server needs none once its base URL is set
    module: str | None = None  # what ``build`` imports (a live provider's SDK): imported on first use


# A live provider's module (``ProviderEntry.module``) is imported when a role is first built with it:
# its SDK takes a second or more of CPU to import, which a service that never calls it (scripted runs,
# the other provider) does not pay; ``run_provider`` imports it off the event loop.
def _anthropic(settings: Settings, at: Endpoint) -> ModelProvider:
    from shared.providers.anthropic import AnthropicProvider

    assert at.api_key is not None
    return AnthropicProvider(at.api_key, at.base_url, settings.model_timeout_s, prompt_caching=settings.prompt_caching)


def _openai(settings: Settings, at: Endpoint) -> ModelProvider:
    from shared.providers.openai import OpenAIProvider

    return OpenAIProvider(at.api_key, at.base_url, settings.model_timeout_s)


PROVIDERS: dict[ProviderName, ProviderEntry] = {
    "scripted": ProviderEntry(
        live=False, key_env="", key=lambda s: None, base_url=lambda s: None, build=None, needs_key=False
    ),
    "anthropic": ProviderEntry(
        live=True,
        key_env="ANTHROPIC_API_KEY",
        key=lambda s: s.anthropic_api_key,
        base_url=lambda s: s.anthropic_base_url,
        build=_anthropic,
        module=f"{__package__}.anthropic",  # a string the wheel's import rewrite would not see
    ),
    "openai": ProviderEntry(
        live=True,
        key_env="OPENAI_API_KEY",
        key=lambda s: s.openai_api_key,
        base_url=lambda s: s.openai_base_url,
        build=_openai,
        needs_key=False,
        module=f"{__package__}.openai",
    ),
}
if set(PROVIDERS) != set(get_args(ProviderName)):
    raise RuntimeError("shared/providers/select.py: every ProviderName needs its row in PROVIDERS")
AUTO_ORDER = tuple(name for name, entry in PROVIDERS.items() if entry.live)
"""``auto``: the first live provider (in the registry's order) whose key is set, else scripted."""


def configured(settings: Settings, which: Role) -> ProviderName | Literal["auto"]:
    """The role's provider setting as written (``auto`` included)."""
    return settings.planner_provider if which == "planner" else settings.judge_provider


def provider_name(settings: Settings, which: Role) -> ProviderName:
    """The role's provider: as set, or for ``auto`` the first live provider whose key is set."""
    chosen = configured(settings, which)
    if chosen != "auto":
        return chosen
    return next((name for name in AUTO_ORDER if PROVIDERS[name].key(settings) is not None), "scripted")


def pinned_live(settings: Settings, which: Role) -> bool:
    """The role is set to a live provider by name: a run's scenario does not replace it."""
    chosen = configured(settings, which)
    return chosen != "auto" and PROVIDERS[chosen].live


def endpoint(settings: Settings, which: Role, name: ProviderName) -> Endpoint:
    entry = PROVIDERS[name]
    role_key = settings.planner_api_key if which == "planner" else settings.judge_api_key
    role_url = settings.planner_base_url if which == "planner" else settings.judge_base_url
    key = role_key or entry.key(settings)
    return Endpoint(key.get_secret_value() if key is not None else None, role_url or entry.base_url(settings))


def provider_for(settings: Settings, which: Role, scenario: Scenario | None) -> ModelProvider:
    """The run's provider. A run submitted with a scenario is replayed by the scripted
    provider unless the role is pinned to a live provider."""
    if scenario is not None and not pinned_live(settings, which):
        return ScriptedProvider(scenario, settings.prompt_caching)
    name = provider_name(settings, which)
    entry = PROVIDERS[name]
    if entry.build is None:
        raise ProviderError(
            f"{which} provider is scripted but this run has no scenario; submit one with --scenario or set "
            f"{' or '.join(PROVIDERS[n].key_env for n in AUTO_ORDER)}",
            transient=False,
            kind="config",
        )
    at = endpoint(settings, which, name)
    if entry.needs_key and at.api_key is None:
        raise ProviderError(
            f"{which} provider is {name} but {entry.key_env} is not set", transient=False, kind="config"
        )
    if at.api_key is None and at.base_url is None:
        raise ProviderError(
            f"{which} provider is {name} but neither {entry.key_env} nor a base URL "
            f"(LW_{which.upper()}_BASE_URL) is set",
            transient=False,
            kind="config",
        )
    return entry.build(settings, at)


async def run_provider(bus: Bus, settings: Settings, which: Role, run_id: str) -> ModelProvider:
    """The provider serving ``run_id``: ``provider_for`` with the scenario bound to the run, if any.
    A storage error reading the binding is raised (the caller's message is redelivered)."""
    scenario = None if pinned_live(settings, which) else await scripted_by(bus, settings, run_id)
    module = PROVIDERS[provider_name(settings, which)].module
    if scenario is None and module is not None and module not in sys.modules:
        await asyncio.to_thread(importlib.import_module, module)  # the first live call: the loop keeps running
    return provider_for(settings, which, scenario)


async def scripted_tools(bus: Bus, settings: Settings, run_id: str) -> Scenario | None:
    """The scenario whose tool behaviour applies to ``run_id``'s tool calls: only a run submitted with one
    and replayed as scripted (a live run never consults a scenario: the planner removes one stored before a
    live run starts), so none where scripted runs are not allowed or the planner is pinned to a live model."""
    if pinned_live(settings, "planner"):
        return None
    return await scripted_by(bus, settings, run_id)


async def scripted_by(bus: Bus, settings: Settings, run_id: str) -> Scenario | None:
    """The scenario bound to ``run_id`` where it is replayed: where scripted runs are allowed, or an operator's
    replay (bound by the planner from the replay subject, ``Scenario.replay``) anywhere."""
    scenario = await bound_scenario(bus, run_id)
    return scenario if scenario is not None and (settings.allow_scripted or scenario.replay) else None
