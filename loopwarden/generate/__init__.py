"""Build-time generators: the files ``make schemas`` writes from the code, and the release's contract check.

``python -m loopwarden.generate`` writes every generated file: ``schemas/messages/`` (``messages``),
``schemas/asyncapi.json`` (``asyncapi``), ``deploy/nats/auth.conf`` (``auth_conf``), ``schemas/scenario.json``,
``agent.json``, ``access.json`` (``files``) and ``schemas/records/RunRecord.json`` (``records``);
``python -m loopwarden.generate snapshot|check`` stores or checks a release's contracts (``compat``). The drift
tests regenerate each file and compare. Nothing at run time imports this package (``tests/repo/test_code_quality.py``),
and the wheel does not ship it: it writes into the repository.
"""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from shared.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "schemas"


class DefaultSettings(Settings):
    """The settings defaults alone: a generated file must not depend on the generating shell's env."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)
