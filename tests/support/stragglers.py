"""No process outlives the test run that started it.

Fixtures own the processes they start and stop them. This plugin is the net under them: the pytest
process that runs the session (the xdist controller, or the only process) puts a run id in its
environment before anything starts, so every process the run starts (nats-servers, services, consoles,
``loopwarden up`` stacks that detach into their own session) inherits it. When the session ends, any
process still carrying the id, or still below the pytest process, is a straggler: it is killed by pid,
named in the report, and the session exit status becomes "tests failed".

``tests/conftest.py`` imports these hooks; ``pytest -p tests.support.stragglers`` loads them on their own.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Generator

import psutil
import pytest

from tests.support.timing import bound

RUN_ENV = "LW_TEST_RUN"
STRAGGLERS = pytest.StashKey[list[str]]()
WORKERS = pytest.StashKey[set[int]]()


def is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def of_run(value: str | None, run_id: str) -> bool:
    return value is not None and (value == run_id or value.startswith(run_id + "/"))


def run_processes(run_id: str, exclude: set[int]) -> list[psutil.Process]:
    """Live processes started by this run: carrying ``run_id`` in their environment, or below this process."""
    found: dict[int, psutil.Process] = {}
    with_me = psutil.Process()
    for proc in with_me.children(recursive=True):
        found[proc.pid] = proc
    for proc in psutil.process_iter():
        if proc.pid in found or proc.pid in exclude:
            continue
        try:
            if of_run(proc.environ().get(RUN_ENV), run_id):
                found[proc.pid] = proc
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    live = []
    for pid, proc in found.items():
        if pid in exclude:
            continue
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                live.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return live


def describe(proc: psutil.Process) -> str:
    try:
        return f"pid {proc.pid}: {' '.join(proc.cmdline())[:200]}"
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return f"pid {proc.pid}"


def kill_stragglers(run_id: str, exclude: set[int]) -> list[str]:
    """Kill what the run left running (after a short grace for processes already on their way out);
    returns one line per process killed. The scan is repeated until one finds nothing: a process read at the
    wrong moment (its environment unreadable for an instant on a loaded machine) is caught by the next."""
    named: list[str] = []
    for _ in range(3):
        _, alive = psutil.wait_procs(run_processes(run_id, exclude), timeout=bound(2) if not named else 0)
        if not alive:
            break
        named += [describe(p) for p in alive]
        for proc in alive:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                continue
        _, still = psutil.wait_procs(alive, timeout=bound(5))
        named += [f"{describe(p)} (still alive after SIGKILL)" for p in still]
        exclude = exclude | {p.pid for p in still}
    return named


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if is_worker(config):
        return  # the controller's id came with the environment the worker started in
    # a new id; a pytest run inside a test extends its parent run's id, so the outer run still finds what
    # the inner one leaves behind (e.g. when the inner run itself is killed)
    outer = os.environ.get(RUN_ENV)
    mine = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    os.environ[RUN_ENV] = f"{outer}/{mine}" if outer else mine


# trylast: the innermost wrapper, so xdist has shut its workers down (a plain hook) before the check,
# and the terminal reporter (an outer wrapper) prints the summary after it
@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> Generator[None, None, None]:
    config = session.config
    if is_worker(config):
        return (yield)
    # xdist's workers are this process's children until its own sessionfinish shuts them down
    workers = {p.pid for p in psutil.Process().children()} if config.pluginmanager.has_plugin("dsession") else set()
    result = yield
    me = psutil.Process()
    exclude = {me.pid, *workers, *(p.pid for p in me.parents())}
    killed = kill_stragglers(os.environ[RUN_ENV], exclude)
    config.stash[STRAGGLERS] = killed
    if killed:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    return result


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    killed = config.stash.get(STRAGGLERS, [])
    if killed:
        terminalreporter.section("processes that outlived their tests", red=True)
        terminalreporter.line(f"{len(killed)} process(es) still running after the session; killed:")
        for line in killed:
            terminalreporter.line(f"  {line}")
