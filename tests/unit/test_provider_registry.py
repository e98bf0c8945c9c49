"""Which provider serves a role: the registry in shared/providers/select.py is the one home of that fact."""

from __future__ import annotations

import pytest

from shared.providers.anthropic import AnthropicProvider
from shared.providers.base import ProviderError
from shared.providers.openai import OpenAIProvider
from shared.providers.scripted import ScriptedProvider
from shared.providers.select import endpoint, pinned_live, provider_for, provider_name
from shared.scenario import parse_scenario
from shared.settings import Settings

SCENARIO = parse_scenario({"name": "x", "task": "t"})


def settings(**kw: object) -> Settings:
    base: dict[str, object] = {"anthropic_api_key": None, "openai_api_key": None, "_env_file": None}
    return Settings(**{**base, **kw})  # type: ignore[arg-type]


def test_auto_picks_the_first_provider_with_a_key_else_scripted() -> None:
    assert provider_name(settings(), "planner") == "scripted"
    assert provider_name(settings(openai_api_key="k"), "planner") == "openai"
    assert provider_name(settings(openai_api_key="k", anthropic_api_key="a"), "judge") == "anthropic"


def test_planner_on_openai_and_judge_on_anthropic_each_with_their_own_endpoint() -> None:
    s = settings(
        planner_provider="openai",
        planner_base_url="http://127.0.0.1:11434/v1",
        judge_provider="anthropic",
        judge_api_key="judge-key",
    )
    assert isinstance(provider_for(s, "planner", None), OpenAIProvider)
    assert isinstance(provider_for(s, "judge", None), AnthropicProvider)
    assert endpoint(s, "planner", "openai").base_url == "http://127.0.0.1:11434/v1"
    assert endpoint(s, "judge", "anthropic").api_key == "judge-key"


def test_a_role_pinned_to_a_live_provider_is_not_replaced_by_a_scenario() -> None:
    s = settings(planner_provider="openai", openai_api_key="k", judge_provider="auto", anthropic_api_key="a")
    assert pinned_live(s, "planner") and not pinned_live(s, "judge")
    assert isinstance(provider_for(s, "planner", SCENARIO), OpenAIProvider)
    assert isinstance(provider_for(s, "judge", SCENARIO), ScriptedProvider)


def test_an_openai_role_without_key_or_endpoint_is_a_config_error_naming_both() -> None:
    with pytest.raises(ProviderError) as raised:
        provider_for(settings(judge_provider="openai"), "judge", None)
    assert raised.value.kind == "config"
    assert "OPENAI_API_KEY" in str(raised.value) and "LW_JUDGE_BASE_URL" in str(raised.value)


def test_a_service_imports_no_model_sdk_until_a_role_is_built_with_it() -> None:
    """The planner, judge and executor start without the anthropic and openai SDKs (they took 2.2 s of a
    planner's 3.1 s of imports); each live provider names the module its builder imports."""
    import subprocess
    import sys

    from shared.providers.select import PROVIDERS

    code = (
        "import sys, services.planner.app, services.judge.app, services.executor.app\n"
        "print(sorted(m for m in ('anthropic', 'openai') if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]", loaded
    assert {n: e.module for n, e in PROVIDERS.items() if e.live} == {
        "anthropic": "shared.providers.anthropic",
        "openai": "shared.providers.openai",
    }
