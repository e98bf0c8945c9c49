"""The systemd units for a bare-metal deployment (deploy/systemd/): each process is started again when it exits,
within a bound, and each names what exists (a service module, nats-server's reload)."""

from __future__ import annotations

import configparser
import subprocess

from loopwarden.stack import PROCESSES, module_of
from tests.support.paths import ROOT

UNITS = ROOT / "deploy" / "systemd"


def unit(name: str) -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser(strict=False)  # EnvironmentFile= may repeat
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string((UNITS / name).read_text())
    return parser


def test_every_unit_restarts_what_exits_within_a_bound() -> None:
    names = sorted(p.name for p in UNITS.glob("*.service"))
    assert names == ["loopwarden-nats@.service", "loopwarden-retention.service", "loopwarden@.service"]
    for name in names:
        u = unit(name)
        assert u["Service"]["Restart"] == "on-failure", name
        assert int(u["Unit"]["StartLimitBurst"]) == 5 and int(u["Unit"]["StartLimitIntervalSec"]) == 600, name
        assert u["Service"]["User"] == "loopwarden", name


def test_a_service_instance_names_its_module() -> None:
    start = unit("loopwarden@.service")["Service"]["ExecStart"]
    script = start.split("'")[1].replace("%%", "%").replace("$$", "$")  # systemd's escapes, undone
    for service in PROCESSES:
        module = subprocess.run(
            ["sh", "-c", script.replace("exec ", "echo ", 1), f"{service}-2"], capture_output=True, text=True
        ).stdout.split()[-1]
        expected = module_of(service).replace("services.", "loopwarden.services.", 1)  # as the wheel installs it
        assert module == expected, (service, module)
        in_repository = (
            expected.removeprefix("loopwarden.") if expected.startswith("loopwarden.services.") else expected
        )
        assert (ROOT / in_repository.replace(".", "/") / "__main__.py").exists(), in_repository


def test_a_node_reloads_its_configuration_without_a_restart() -> None:
    node = unit("loopwarden-nats@.service")["Service"]
    assert node["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert "/var/lib/loopwarden/nats/n%i/server.conf" in node["ExecStart"]
