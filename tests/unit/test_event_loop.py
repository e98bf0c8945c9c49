"""A service runs on the event loop ``LW_EVENT_LOOP`` names: uvloop by default, the standard loop on request."""

from __future__ import annotations

import asyncio

import pytest
import uvloop

from shared.service import run
from shared.settings import Settings, SettingsError, load_settings


def loop_type(settings: Settings) -> type:
    seen: list[type] = []

    async def main() -> None:
        seen.append(type(asyncio.get_running_loop()))

    run(main(), settings)
    return seen[0]


def test_uvloop_by_default_and_the_standard_loop_on_request() -> None:
    assert Settings().event_loop == "uvloop"
    assert loop_type(Settings()) is uvloop.Loop
    assert not issubclass(loop_type(Settings(event_loop="asyncio")), uvloop.Loop)


def test_an_unknown_event_loop_stops_the_service_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LW_EVENT_LOOP", "trio")
    with pytest.raises(SettingsError):
        load_settings("planner")
    assert "LW_EVENT_LOOP" in capsys.readouterr().err
