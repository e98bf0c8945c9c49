"""Commands for whoever runs the system on a machine: ``demo``, ``up``, ``down``, ``bootstrap``.

The running stack is recorded in the state directory (``LW_STATE_DIR``, default a per-user
folder: see ``cli_common.state_dir``), so ``down``, ``status`` and the rest find it from any folder.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loopwarden.cli_common import (
    FAILED,
    INTERRUPTED,
    OK,
    TIMED_OUT,
    UNREACHABLE,
    USAGE,
    UserError,
    connected,
    env_nats_url,
    load_scenario_file,
    plain,
    probe,
    recorded_stack,
    say,
    settings,
    stack_file,
    state_dir,
)
from shared.urls import redact_url

if TYPE_CHECKING:
    from loopwarden.stack import LocalStack

DEFAULT_PORT = 4222  # the README's: `up` starts nats-server here unless told otherwise


def default_scenario() -> Path:
    from loopwarden.data import scenarios_dir

    return scenarios_dir() / "demo.yaml"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "demo",
        help="start everything, run a demo agent with live progress, stop everything",
        description="Start nats-server (unless NATS_URL names one), the six services and the console; run a "
        "scenario (or a live task) showing each step; print the outcome; stop everything (also on Ctrl-C).",
    )
    p.add_argument("--scenario", help="scripted scenario to replay (default: the shipped demo.yaml)")
    p.add_argument(
        "--live",
        action="store_true",
        help="no scenario: the live provider (LW_PLANNER_PROVIDER: anthropic or openai, with its key and base URL)",
    )
    p.add_argument(
        "--task",
        default="Explain JetStream message de-duplication in two sentences.",
        help="the task for --live (default: %(default)r)",
    )
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the run (default: 120)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser(
        "up",
        help="start nats-server and the six services in the background (--locked: as production runs them)",
        description=f"Start nats-server on 127.0.0.1:{DEFAULT_PORT} (or --port; with NATS_URL/LW_NATS_URL set, use "
        "that server instead), the six services and the console, detached, under a supervisor that starts again "
        "any of them that exits (with a backoff, logged in logs/supervisor.log, at most 5 times in 10 minutes). "
        "--locked runs the production mode: nats-server with the auth.conf generated from an access file (the "
        "example unless --access), bootstrap as the admin, every service as its own NATS user with its own "
        "password; scripted runs follow LW_ALLOW_SCRIPTED. The stack is recorded in the state directory, so "
        "`loopwarden down` stops it from any folder.",
    )
    p.add_argument("--port", type=int, help=f"start nats-server on this port (default: {DEFAULT_PORT})")
    p.add_argument("--locked", action="store_true", help="the production mode: auth.conf, a NATS user per service")
    p.add_argument("--access", metavar="FILE", help="with --locked: the access file (default: the example)")
    p.set_defaults(func=cmd_up)

    p = sub.add_parser(
        "down",
        help="stop what `up` started",
        description="Stop the services and the nats-server `loopwarden up` started (found in the state directory).",
    )
    p.set_defaults(func=cmd_down)

    p = sub.add_parser(
        "bootstrap",
        help="create/update streams, buckets and consumers (admin user; for LW_MANAGE_STREAMS=false)",
        description="Create or update the streams and buckets with the configured replica counts, and every "
        "service's durable consumers (run as the admin user where LW_MANAGE_STREAMS=false).",
    )
    p.set_defaults(func=cmd_bootstrap)


# --- demo ---------------------------------------------------------------------------------------
async def _run_and_watch(nats_url: str, scenario: Any, scenario_path: Path | None, task: str, timeout: float) -> int:
    from loopwarden.client import new_run_id
    from loopwarden.progress import render
    from shared.messages import RunSubmit

    async with connected(settings(nats_url)) as client:
        run_id = new_run_id()
        async with await client.watch(run_id) as watch:  # subscribed before the run is submitted
            if scenario is not None:
                say(f"scenario: {scenario.name} ({scenario_path})")
                await client.submit_scenario(scenario, run_id)
            else:
                await client.submit(RunSubmit(run_id=run_id, task=task))
            say(f"run id: {run_id}")
            deadline = asyncio.get_running_loop().time() + timeout
            while True:
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    say(f"timed out after {timeout:.0f}s", err=True)
                    return TIMED_OUT
                event = await watch.next(timeout=min(0.5, remaining))
                if event is None:
                    continue
                line = render(event)
                if line:
                    say(plain(line))
                if event.kind in ("run.completed", "run.stopped", "run.failed"):
                    break
                if event.kind == "run.escalated":
                    say(
                        "  (waiting for a human: `loopwarden escalations list`, then `loopwarden escalations "
                        "resolve ID --action resume|abort`)"
                    )
        state = await client.wait(run_id, timeout=5)
        say()
        say(f"run id:       {run_id}")
        say(plain(f"status:       {state.status} — {state.final_reason}"))
        say(f"iterations:   {state.iteration.n} (continues {state.continue_count}, retries {state.retry_count})")
        say(
            f"tokens:       in {state.usage.input_tokens}, out {state.usage.output_tokens}, "
            f"cost ${state.usage.cost_usd:.4f}"
        )
        if state.first_draft_passed is not None:
            say(f"first draft:  {'passed' if state.first_draft_passed else 'rejected'}")
        say(f"final answer:\n{state.final_output}")
        return OK if state.status == "completed" else FAILED


def cmd_demo(args: argparse.Namespace) -> int:
    from loopwarden.stack import LocalStack, StackError

    scenario_path = None if args.live else Path(args.scenario or default_scenario())
    scenario = load_scenario_file(scenario_path) if scenario_path is not None else None  # before starting anything
    nats_url = env_nats_url()
    if nats_url:
        asyncio.run(probe(settings(nats_url)))
    stack = LocalStack(state_dir=state_dir() / "demo", nats_url=nats_url)
    what = "the six services" if nats_url else "nats-server (JetStream), the six services"
    say(f"starting {what} and the console ...")
    try:
        stack.start()
        say(f"stack up on {redact_url(stack.nats_url or '')} (logs in {stack.state_dir / 'logs'})")
        say(_console_line(stack))
        return asyncio.run(_run_and_watch(stack.nats_url or "", scenario, scenario_path, args.task, args.timeout))
    except KeyboardInterrupt:
        say("\ninterrupted: stopping everything", err=True)
        return INTERRUPTED
    except StackError as err:
        say(f"could not start the stack: {err}", err=True)
        return UNREACHABLE
    finally:
        stack.stop()
        say("stopped nats-server and the services.")


# --- up / down ----------------------------------------------------------------------------------
def cmd_up(args: argparse.Namespace) -> int:
    from loopwarden.stack import LocalStack, StackError, saved_alive
    from loopwarden.supervise import SUPERVISED, spawn_supervisor, supervised_metrics

    path = stack_file()
    if recorded_stack() is not None:
        running = saved_alive(path)
        if running:
            raise UserError(
                f"a stack is already running ({', '.join(running)}), recorded in {path}; `loopwarden down` stops it",
                FAILED,
            )
        path.unlink()  # what it recorded is gone (a reboot, a kill): start afresh
        say(f"removed the record of a stack that no longer runs ({path})")
    nats_url = env_nats_url()
    if nats_url and args.port:
        raise UserError("--port starts a nats-server; NATS_URL/LW_NATS_URL names an existing one: give one of them")
    if args.locked and nats_url:
        raise UserError("--locked starts its own nats-server with the generated auth.conf: unset NATS_URL/LW_NATS_URL")
    if args.access and not args.locked:
        raise UserError("--access goes with --locked")
    if nats_url:
        asyncio.run(probe(settings(nats_url)))  # an existing server must answer
    root = state_dir() / "stack"
    locked = _locked_setup(root, args.access) if args.locked else None
    stack = LocalStack(
        state_dir=root,
        nats_url=nats_url,
        nats_port=args.port or DEFAULT_PORT,
        detach=True,
        locked=locked,
        env_per_service=locked.service_env() if locked else {},
    )
    try:
        if stack.nats_url is None:
            stack.start_nats()
        if locked is not None:
            for line in asyncio.run(locked.bootstrap_and_apply(stack.nats_url or "")):
                say(line)
        spawn_supervisor(stack)
        stack.console_url = _console_url(stack) or stack.console_url
    except StackError as err:
        stack.stop()
        say(f"could not start the stack: {err}", err=True)
        return UNREACHABLE
    except KeyboardInterrupt:
        stack.stop()
        say("\ninterrupted: stopped what had started", err=True)
        return INTERRUPTED
    metrics = supervised_metrics(stack.state_dir)
    stack.save(path, {"locked": locked.record(stack) if locked is not None else None, "metrics": metrics})
    say(f"up: {redact_url(stack.nats_url or '')}; logs in {stack.state_dir / 'logs'}; `loopwarden down` stops it")
    say(f"supervised: a process that exits is started again (logs/supervisor.log, {stack.state_dir / SUPERVISED})")
    if locked is not None:
        for line in locked.how_to_connect(stack.nats_url or ""):
            say(line)
        allowed = settings().allow_scripted
        say(f"  scripted runs: {'allowed' if allowed else 'refused'} (LW_ALLOW_SCRIPTED={str(allowed).lower()})")
        if stack.console_url:
            say(f"console: {stack.console_url}")
    else:
        say(_console_line(stack))
    say("metrics (Prometheus text, docs/observability.md): " + ", ".join(f"{n} {u}" for n, u in metrics.items()))
    return OK


def _console_url(stack: LocalStack) -> str | None:
    """The address the supervised console says it listens on (its ready line)."""
    from loopwarden.console.local import url_from_log

    log = stack.state_dir / "logs" / "console.log"
    return url_from_log(log.read_text(errors="replace")) if log.exists() else None


def _locked_setup(root: Path, access: str | None) -> Any:
    from loopwarden.locked import LockedSetup
    from shared.access import AccessError

    try:
        return LockedSetup.prepare(root, Path(access) if access else None)
    except AccessError as err:
        raise UserError(str(err), USAGE) from None


def cmd_down(args: argparse.Namespace) -> int:
    from loopwarden.stack import stop_saved

    path = stack_file()
    if not path.exists():
        say(f"nothing was running (no stack recorded in {path})")
        return OK
    try:
        stopped = stop_saved(path)
    except (ValueError, KeyError) as err:
        raise UserError(f"{path}: unreadable stack record ({err}); stop its processes by hand, remove it") from None
    say("stopped: " + (", ".join(stopped) if stopped else "nothing (the recorded processes had already exited)"))
    return OK


def _console_line(stack: LocalStack) -> str | None:
    if stack.console_url is None:
        return None
    where = f" (operator passwords in {stack.console_passwords})" if stack.console_passwords else ""
    return f"console: {stack.console_url}{where}"


async def cmd_bootstrap(args: argparse.Namespace) -> int:
    """Create or update streams, buckets and every service's durable consumers (admin user)."""
    from loopwarden.infra import bootstrap
    from shared import subjects as S
    from shared.bus import BoundTooSmall

    cfg = settings()
    await probe(cfg)
    try:
        report = await bootstrap(cfg)
    except BoundTooSmall as err:  # nothing was lowered below what a stream holds
        raise UserError(str(err), FAILED) from None
    for line in report.changed:
        say(line)
    say(
        f"streams {', '.join(S.STREAM_SUBJECTS)} (replicas {cfg.stream_replicas}), "
        f"{len(S.ALL_BUCKETS)} buckets (replicas {cfg.kv_replicas}) and "
        f"{len(report.consumers)} consumers are in place"
    )
    return OK
