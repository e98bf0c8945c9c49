"""``LW_NATS_SYNC_INTERVAL`` as nats-server's ``sync_interval`` reads it (pure): ``always``, or a duration
written in seconds or milliseconds (in a nats config a bare ``2m`` is the number 2,000,000)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from shared.settings import Settings, sync_interval


@pytest.mark.parametrize(
    ("given", "written"),
    [
        ("always", "always"),
        (" Always ", "always"),
        ("2m", "120s"),  # minutes as seconds: the config would read a bare 2m as a size
        ("1h", "3600s"),
        ("1s", "1s"),
        ("500ms", "500ms"),
    ],
)
def test_a_level_is_written_as_the_server_reads_it(given: str, written: str) -> None:
    assert sync_interval(given) == written


@pytest.mark.parametrize("bad", ["", "0s", "2 min", "1d", "never", "-1s", "fast"])
def test_anything_else_is_refused_naming_the_setting_and_the_forms(bad: str) -> None:
    with pytest.raises(ValidationError) as err:
        Settings(nats_sync_interval=bad)
    assert "nats_sync_interval" in str(err.value)
    assert "neither 'always' nor a duration such as 500ms, 1s, 2m or 1h" in str(err.value)


def test_unset_is_the_servers_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LW_NATS_SYNC_INTERVAL", raising=False)
    assert Settings().nats_sync_interval is None
