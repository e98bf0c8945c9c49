"""``loopwarden``: run the demo, start/stop a local stack, submit and inspect runs, work the queue.

The commands live by audience; a new command goes in the module of the people who use it
(each has a ``register(sub)`` that adds its parsers):

- ``cli_stack``   running the system on a machine: demo, up, down, bootstrap
- ``cli_runs``    submitting and following runs: submit, status, events, trace, metrics, dlq
- ``cli_fleet``   the fleet as flow control sees it: fleet
- ``cli_agents``  agents a user names and runs: agents register|list|show, run AGENT, runs
- ``cli_queue``   operators on the human queue: escalations ...
- ``cli_records`` keeping and reproducing runs: export, replay, retention
- ``cli_offline`` checks that need no stack: lint, check-contract, check-scenario
- ``cli_config``  the admin: config check|apply|show|hash (tenants and operators), cluster-config
- ``cli_common``  the conventions they share: exit codes, UserError, bounded connect, output

Start-up is part of every command's answer (and the test suite runs some 300 commands as processes), so
building the parser is cheap: a command module imports at its top only what its ``register`` needs (argparse,
``cli_common``, the standard library, small tables such as ``shared.escalation_actions``), and a command's handler
imports what it runs (the client, the bus, the wire models, the stack) when it is called. ``--help``, a usage
error and ``--version`` load neither pydantic nor NATS (tests/repo/test_cli_startup.py holds this).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import inspect
import os
import sys

from loopwarden.cli_common import EXIT_CODES_HELP, INTERRUPTED, OK, UserError, bus_failure, env_nats_url, say
from shared import gc_policy

# The modules whose ``register(sub)`` add the commands, in the order ``--help`` lists them (fake_model: live runs
# offline). ``build_parser`` imports them, not this module's top, and ``main`` sets the garbage collector's
# thresholds first (shared/gc_policy.py): what a command runs still loads most of the tree.
AUDIENCES = (
    "cli_stack",
    "cli_runs",
    "cli_fleet",
    "cli_agents",
    "cli_queue",
    "cli_records",
    "cli_offline",
    "cli_config",
    "fake_model",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="loopwarden",
        description="LLM agent tool loops as services on NATS: run the demo, start/stop a local stack, submit and "
        "inspect runs, work the human queue, check contracts and scenarios offline. Commands that talk to NATS "
        "use LW_NATS_URL/NATS_URL, else the stack `loopwarden up` recorded (LW_STATE_DIR, default "
        "~/.local/state/loopwarden), else nats://127.0.0.1:4222.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=ShowVersion)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for audience in AUDIENCES:
        importlib.import_module(f"loopwarden.{audience}").register(sub)
    for child in sub.choices.values():  # every command's --help ends with the exit codes
        child.epilog = child.epilog or EXIT_CODES_HELP
        child.formatter_class = argparse.RawDescriptionHelpFormatter
    return parser


class ShowVersion(argparse.Action):
    """argparse's ``version`` action, except that the release is read when asked for, not by every command
    (``shared.version`` reads pyproject.toml, else the installed metadata through importlib.metadata)."""

    def __init__(self, option_strings: list[str], dest: str) -> None:
        text = "show program's version number and exit"
        super().__init__(option_strings, argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0, help=text)

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        from shared.version import package_version

        print(f"{parser.prog} {package_version()}")
        parser.exit()


def run(args: argparse.Namespace) -> int:
    """One convention: a command returns its exit code, or a coroutine that does (run here)."""
    result = args.func(args)
    if inspect.iscoroutine(result):
        result = asyncio.run(result)
    return int(result or OK)


def main(argv: list[str] | None = None) -> int:
    """The process's entry (``loopwarden``, ``python -m loopwarden.cli``): one command, its exit code."""
    gc_policy.set_thresholds()  # before the commands' modules load (AUDIENCES)
    try:
        return run_command(argv)
    finally:
        gc_policy.ending()  # the process exits next (also on --help and on a usage error: argparse's SystemExit)


def run_command(argv: list[str] | None) -> int:
    for stream in (sys.stdout, sys.stderr):  # a terminal that cannot show a character gets '?', not a traceback
        with contextlib.suppress(AttributeError, ValueError):
            stream.reconfigure(errors="replace")  # type: ignore[union-attr]
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except UserError as err:
        say(f"loopwarden {args.command}: {err}", err=True)
        return err.code
    except BrokenPipeError:  # `loopwarden runs --json | head`: the reader is gone, and that is all
        quiet_stdout()
        return OK
    except Exception as err:  # a failure talking to NATS mid-command is a line too; anything else is a bug
        failure = bus_failure(err, env_nats_url())
        if failure is None:
            raise
        say(f"loopwarden {args.command}: {failure}", err=True)
        return failure.code
    except KeyboardInterrupt:
        say("interrupted", err=True)
        return INTERRUPTED


def quiet_stdout() -> None:
    """Nothing more can be written: standard output goes to /dev/null, so the interpreter's last flush of what
    was buffered for the gone reader is not a second BrokenPipeError."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())
