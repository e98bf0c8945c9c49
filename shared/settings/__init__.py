"""The one settings object every service and the CLI read (env prefix ``LW_``).

A bad value stops the process at start with the setting's environment name, so an
operator sees ``LW_MAX_ITERATIONS`` rather than a traceback from deep inside a handler.

``Settings`` is one object; its fields are declared by concern, one module each (``bus``, ``models``,
``runs``, ``tools``, ``people``, ``operations``, ``fleet``, ``bounds``, ``liveness``), and this face re-exports
every name callers import (``from shared.settings import Settings``).
"""

from __future__ import annotations

import sys

from pydantic import AliasChoices, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.settings.bounds import BoundSettings
from shared.settings.bus import BusSettings, sync_interval
from shared.settings.fleet import FleetSettings
from shared.settings.liveness import LivenessSettings
from shared.settings.models import ModelSettings, ProviderName
from shared.settings.operations import OperationSettings
from shared.settings.people import PeopleSettings
from shared.settings.runs import (
    BODY_MAX_BYTES,
    RUN_LIMIT_CAPS,
    LoopPolicy,
    NotJudgedPolicy,
    RunSettings,
    body_limit,
)
from shared.settings.tools import FaultPoint, McpServerSpec, ToolSettings

__all__ = [
    "BODY_MAX_BYTES",
    "RUN_LIMIT_CAPS",
    "FaultPoint",
    "LoopPolicy",
    "McpServerSpec",
    "NotJudgedPolicy",
    "ProviderName",
    "Settings",
    "SettingsError",
    "describe_settings_error",
    "env_name",
    "load_settings",
    "sync_interval",
]


class Settings(
    BusSettings,
    ModelSettings,
    RunSettings,
    ToolSettings,
    PeopleSettings,
    OperationSettings,
    FleetSettings,
    BoundSettings,
    LivenessSettings,
    BaseSettings,
):
    model_config = SettingsConfigDict(env_prefix="LW_", extra="ignore", frozen=True)

    def body_limit(self, message_type: str) -> int:
        """The largest body of ``message_type`` a service reads (``LW_BODY_MAX_BYTES``, ``shared/settings/runs.py``)."""
        return body_limit(self.body_max_bytes, message_type, self.tool_output_max_bytes)


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
        where = ".".join(str(part) for part in e["loc"][1:])  # inside a JSON setting: the entry's path
        lines.append(f"invalid setting {env_name(field)}{f' at {where}' if where else ''}: {e['msg']}{shown}")
    return "\n".join(lines)


def load_settings(service: str = "loopwarden", **overrides: object) -> Settings:
    """Read settings from the environment, or stop the process naming the bad setting."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as err:
        print(f"{service}: {describe_settings_error(err)}", file=sys.stderr)
        raise SettingsError(2) from None
