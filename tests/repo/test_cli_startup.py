"""The CLI builds its parser without loading what its commands run (loopwarden/cli.py's docstring).

Every ``loopwarden`` command is a fresh process, and the test suite starts some 300 of them. When building the
parser imported the commands' implementations (the wire models' pydantic validators, faststream, OpenTelemetry's
SDK, the stack's channel table), ``loopwarden --help`` took 0.39 s of CPU on a quiet machine, and every command
paid it; after, 0.06 s. The guard is a property, not a timing: ``--help`` of every command, a usage error and
``--version`` leave none of those modules loaded, so a command module that imports one at its top again fails here,
naming it; and the commands that need no server (``check-scenario``, ``down`` with nothing running) load neither the
bus nor the libraries under it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.paths import ROOT
from tests.support.timing import bound

# What a command loads when it runs, never to build the parser: third-party roots, and our own heavy modules
HEAVY_ROOTS = ("pydantic", "pydantic_core", "pydantic_settings", "faststream", "nats", "opentelemetry", "tiktoken")
HEAVY_OURS = (
    "shared.messages",
    "shared.settings",
    "shared.bus",
    "shared.channels",
    "loopwarden.client",
    "loopwarden.stack",
    "loopwarden.records",
)
BUS_ROOTS = ("faststream", "nats", "opentelemetry", "tiktoken")
BUS_OURS = ("shared.bus", "loopwarden.client")

# In one process: every command's --help (the nested ones too: `dlq requeue`, `escalations resolve`, `agents
# register`), a usage error and --version, each as main() runs it; then the modules loaded, as JSON.
PROBE = """
import argparse, contextlib, io, json, sys
from loopwarden.cli import build_parser, main

def paths(parser, prefix=()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield (*prefix, name)
                yield from paths(child, (*prefix, name))

def call(argv):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            return main(argv)
        except SystemExit as done:
            return done.code

commands = [list(p) for p in paths(build_parser())]
argvs = [["--help"], *([*c, "--help"] for c in commands), ["status"], ["--version"]]
codes = {" ".join(argv): call(argv) for argv in argvs}
print(json.dumps({"commands": commands, "codes": codes, "modules": sorted(sys.modules)}))
"""


def test_help_usage_errors_and_version_load_no_command_implementation() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=bound(60), check=False
    )
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert len(found["commands"]) > 30, found["commands"]  # the walk reached the nested commands
    assert found["codes"].pop("status") == 2  # a usage error: one line from argparse, exit 2
    assert set(found["codes"].values()) == {0}, found["codes"]
    loaded = [
        m
        for m in found["modules"]
        if m.split(".")[0] in HEAVY_ROOTS or any(m == o or m.startswith(f"{o}.") for o in HEAVY_OURS)
    ]
    assert loaded == [], f"building the CLI's parser loaded {loaded}: import them in the command's handler"


# One command as main() runs it, then the modules loaded, as JSON.
OFFLINE_PROBE = """
import contextlib, io, json, sys
from loopwarden.cli import main

with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    code = main(sys.argv[1:])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def test_commands_that_need_no_server_load_no_bus(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("LW_NATS_URL", "NATS_URL")}
    for argv in (["check-scenario", str(ROOT / "scenarios" / "demo.yaml")], ["down"]):
        proc = subprocess.run(
            [sys.executable, "-c", OFFLINE_PROBE, *argv],
            cwd=ROOT,
            env={**env, "LW_STATE_DIR": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=bound(60),
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        found = json.loads(proc.stdout)
        assert found["code"] == 0, (argv, found["code"])
        loaded = [
            m
            for m in found["modules"]
            if m.split(".")[0] in BUS_ROOTS or any(m == o or m.startswith(f"{o}.") for o in BUS_OURS)
        ]
        assert loaded == [], f"`loopwarden {argv[0]}` loaded {loaded}: it talks to no server"
