"""What every ``loopwarden`` command shares: exit codes, user errors, output, local files, the bus.

The conventions (one of each):

- A command is ``def cmd_x(args) -> int`` or ``async def cmd_x(args) -> int``; ``main`` runs a
  coroutine with ``asyncio.run``. Commands never call ``sys.exit`` and never print tracebacks:
  a mistake the user can fix is raised as :class:`UserError` (one line on stderr, its exit code).
- Local files (scenarios, ``--input``/``--result`` JSON, ``@file``) are read and validated
  before anything connects.
- A command that reads the bus uses :func:`connected`: the server is probed with a bounded
  connect first, so an unreachable server is one line naming the URL, not a hang.
- Reading commands take ``--json`` (one JSON document, or one per line for streams).
- Output goes through :func:`say`: characters the terminal cannot encode are replaced, never
  a ``UnicodeEncodeError``; control characters (escape sequences a run's text may carry) are
  shown as ``\x1b``, never sent to the terminal (:func:`printable`). JSON goes through
  :func:`json_text`, whose escapes keep it valid JSON.
- A URL is printed through :func:`shared.urls.redact_url`: never the password it may carry.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from shared.urls import redact_url

if TYPE_CHECKING:
    from loopwarden.client import Client
    from shared.settings import Settings


# --- exit codes (documented in the README and in `loopwarden --help`) ----------------------------
OK = 0
FAILED = 1  # the command ran and the answer is "no": a run ended without completing, a check failed,
#             the server refused, nothing by that id
USAGE = 2  # bad arguments, a bad local file or a bad setting (argparse exits 2 too)
UNREACHABLE = 3  # NATS is not reachable (or not ready) at the URL, or the local stack could not start
TIMED_OUT = 4  # --wait/--timeout ran out while the run was still going
AWAITING_HUMAN = 5  # the run waits for a person (`loopwarden escalations list`)
INTERRUPTED = 130  # Ctrl-C

EXIT_CODES_HELP = """exit codes:
  0    done (a waited-for run completed, or ended as its scenario's `expect` says)
  1    the answer is no: the run failed or was stopped, a check failed, the server refused, not found,
       a dead letter that cannot be requeued
  2    usage: bad arguments, a missing or invalid local file (scenario, JSON, contract), a bad LW_* setting
  3    NATS unreachable or not ready at the URL named (or the local stack could not start)
  4    timed out waiting for the run (it may still finish: `loopwarden status RUN`)
  5    the run is waiting for a human (`loopwarden escalations list`)
  130  interrupted (Ctrl-C)"""


class UserError(Exception):
    """A mistake the user can fix: printed as one line, no traceback."""

    def __init__(self, message: str, code: int = USAGE) -> None:
        super().__init__(message)
        self.code = code


# --- output -------------------------------------------------------------------------------------
# C0 (but newline and tab), DEL and C1: ESC starts every escape sequence (OSC 52 writes the clipboard,
# OSC 0 the window title, CSI 2J clears the screen), and C1's CSI/OSC do the same on some terminals.
# A run's task, model text, tool outputs and reasons are written by whoever submitted the run.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_JSON_UNESCAPED = re.compile(r"[\x7f-\x9f]")  # json.dumps escapes C0 itself


def printable(text: str) -> str:
    """``text`` with every control character but newline and tab shown as its escape (``\\x1b``)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def json_safe(text: str) -> str:
    """JSON text whose DEL and C1 characters (left raw by ``json.dumps(ensure_ascii=False)`` and by
    pydantic) are ``\\u00XX`` escapes: the same JSON, nothing a terminal acts on."""
    return _JSON_UNESCAPED.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def json_text(value: Any, **dumps: Any) -> str:
    """``json.dumps(value, **dumps)``, safe to print (:func:`json_safe`)."""
    return json_safe(json.dumps(value, **dumps))


def say(line: str | None = "", *, err: bool = False) -> None:
    """Print one line; what the terminal's encoding cannot show is replaced (``?``), never an error,
    and control characters are shown escaped, never acted on (:func:`printable`)."""
    if line is None:
        return
    line = printable(line)
    stream: TextIO = sys.stderr if err else sys.stdout
    encoding = getattr(stream, "encoding", None) or "utf-8"
    try:
        line.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        line = line.encode(encoding, errors="replace").decode(encoding, errors="replace")
    print(line, file=stream, flush=True)


def fancy() -> bool:
    """Symbols (▶ ✓ ⚖ ...) only where the terminal can show them."""
    encoding = (getattr(sys.stdout, "encoding", None) or "").lower().replace("-", "")
    return encoding.startswith("utf")


def plain(text: str) -> str:
    """``text`` with progress symbols spelled in ASCII when the terminal is not UTF-8."""
    if fancy():
        return text
    for symbol, word in ASCII_SYMBOLS.items():
        text = text.replace(symbol, word)
    return text


ASCII_SYMBOLS = {
    "▶": ">",
    "■": "#",
    "→": "->",
    "✓": "ok",
    "✗": "x",
    "⊘": "blocked",
    "⚖": "judge",
    "⇒": "=>",
    "⚑": "!",
    "↺": "resume",
    "↻": "retry",
    "⟳": "loop",
    "—": "-",
    "·": "|",
}


def emit_json(value: Any) -> None:
    say(json_text(value, indent=2, ensure_ascii=not fancy(), default=str))


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of text (for scripts)")


# --- local files --------------------------------------------------------------------------------
def read_text(path: str | Path, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{what}: no such file: {path}") from None
    except IsADirectoryError:
        raise UserError(f"{what}: is a directory: {path}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"{what}: cannot read {path}: {err}") from None


def json_arg(value: str, what: str) -> Any:
    """A JSON option's value: inline JSON, or ``@file.json``."""
    text, where = (read_text(value[1:], what), value[1:]) if value.startswith("@") else (value, "the value")
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise UserError(f"{what}: {where} is not JSON: {err.msg} at line {err.lineno} column {err.colno}") from None


def load_scenario_file(path: str | Path) -> Any:
    """A scenario, read and validated (or a :class:`UserError` naming the field)."""
    from shared.scenario import ScenarioError, load_scenario

    if not Path(path).is_file():
        raise UserError(f"scenario: no such file: {path}")
    try:
        return load_scenario(path)
    except ScenarioError as err:
        raise UserError(str(err)) from None


# --- state and settings -------------------------------------------------------------------------
_BASE: list[Settings] = []


def base_settings() -> Settings:
    """The one settings object as the environment gives it (read once), or a :class:`UserError`
    naming the bad setting."""
    if not _BASE:
        from pydantic import ValidationError

        from shared.settings import Settings, describe_settings_error

        try:
            _BASE.append(Settings())
        except ValidationError as err:
            raise UserError(describe_settings_error(err).splitlines()[0]) from None
    return _BASE[0]


def state_dir() -> Path:
    """Where ``up`` records the running stack and the demo keeps its logs (``loopwarden.stack.state_dir``)."""
    from loopwarden.stack import state_dir as configured_state_dir

    return configured_state_dir(base_settings().state_dir)


def stack_file() -> Path:
    from loopwarden.stack import STACK_RECORD

    return state_dir() / STACK_RECORD


def recorded_stack() -> dict[str, Any] | None:
    from loopwarden.stack import StackError, read_record

    try:
        return read_record(stack_file())
    except StackError as err:
        raise UserError(str(err)) from None


def env_nats_url() -> str | None:
    """The server the environment names (``LW_NATS_URL``/``NATS_URL``), if it names one."""
    if not (os.environ.get("LW_NATS_URL") or os.environ.get("NATS_URL")):
        return None
    return base_settings().nats_url


def settings(nats_url: str | None = None) -> Settings:
    """The one settings object, pointed at: ``nats_url``, else ``LW_NATS_URL``/``NATS_URL``, else the
    stack ``loopwarden up`` recorded, else the default."""
    url = nats_url or env_nats_url()
    if url is None:
        recorded = recorded_stack()
        url = recorded.get("nats_url") if recorded else None
    return base_settings().model_copy(update={"nats_url": url}) if url else base_settings()


# --- the bus ------------------------------------------------------------------------------------
async def probe(cfg: Settings) -> None:
    """One bounded connect (``LW_CLI_CONNECT_TIMEOUT_S``): the server answers at the URL, or a
    :class:`UserError` naming it (the client's own probe: ``loopwarden.client.probe``)."""
    from loopwarden.client import Unreachable
    from loopwarden.client import probe as client_probe

    try:
        await client_probe(cfg, cfg.cli_connect_timeout_s)
    except Unreachable as err:
        raise UserError(str(err), UNREACHABLE) from None


@contextlib.asynccontextmanager
async def connected(
    cfg: Settings | None = None, *, identity: str | None = None, ready_timeout: float = 15.0
) -> AsyncIterator[Client]:
    """A connected :class:`Client` whose connect is bounded: probed first, then ready (streams in
    place) within ``ready_timeout`` or a :class:`UserError` naming the URL. It connects as the user
    ``LW_NATS_USER`` names (``identity``: another), and what the server refuses that user, then or while
    the command runs, is one line, exit 1 ("user client_acme may not read lw_escalations: permission denied")."""
    from loopwarden.client import Client, PermissionDenied, Unreachable

    try:
        client = await Client(cfg or settings(), identity=identity, ready_timeout=ready_timeout).connect()
    except Unreachable as err:
        raise UserError(str(err), UNREACHABLE) from None
    except PermissionDenied as err:
        raise UserError(str(err), FAILED) from None
    try:
        yield client
    except PermissionDenied as err:
        raise UserError(str(err), FAILED) from None
    finally:
        await client.close()


def add_priority_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--priority",
        type=int,
        choices=range(10),
        metavar="0-9",
        help="higher first among your tenant's runs waiting for the fleet (default: the agent's, else 5)",
    )


def bus_failure(err: BaseException, url: str | None = None) -> UserError | None:
    """A failure talking to NATS in the middle of a command, as one line (None: not one of those); a run
    refused at the door (a quota, the daily ceiling, a full submit stream) is one line too, exit 1."""
    from nats.errors import Error as NatsError
    from nats.errors import NoRespondersError

    from loopwarden.client import NotAccepted, PermissionDenied, Refused
    from shared.bus import RequestRefused

    where = f" at {redact_url(url)}" if url else ""
    if isinstance(err, PermissionDenied):
        return UserError(str(err), FAILED)
    if isinstance(err, Refused):
        figures = f" (quota {err.quota}: limit {err.limit:g}, current {err.current:g})" if err.quota else ""
        if err.quota and (err.limit is None or err.current is None):
            figures = f" (quota {err.quota})"
        return UserError(f"{err}{figures}", FAILED)
    if isinstance(err, NotAccepted):
        return UserError(str(err), TIMED_OUT)
    if isinstance(err, RequestRefused):
        return UserError(f"refused: {err}", FAILED)
    if isinstance(err, NoRespondersError):
        return UserError(f"no service answered{where} (is the stack's escalation service running?)", UNREACHABLE)
    if isinstance(err, TimeoutError):
        return UserError(f"NATS{where} did not answer in time", UNREACHABLE)
    if isinstance(err, NatsError):
        return UserError(f"NATS{where} failed: {type(err).__name__}: {err}", UNREACHABLE)
    return None
