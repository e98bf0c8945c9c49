"""The suite cleans up after itself on a busy machine: a process a test leaks fails the run and is killed,
and a local stack whose start fails stops what it started, within its readiness setting."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from loopwarden.stack import LocalStack, StackError
from tests.support.paths import ROOT
from tests.support.stacks import TEST_ENV
from tests.support.timing import bound

LEAKY_MODULE = """
import os
import subprocess
import sys
from pathlib import Path

SLEEP = [sys.executable, "-c", "import time; time.sleep(300)"]


def test_leaks_a_child_and_an_orphan_in_its_own_session():
    child = subprocess.Popen(SLEEP)  # a child the test forgets
    # an orphan: its parent exits at once, and it sits in a session of its own, as `loopwarden up` leaves a stack
    spawner = subprocess.run(
        [sys.executable, "-c",
         "import subprocess, sys; print(subprocess.Popen(%r, start_new_session=True, stdout=subprocess.DEVNULL,"
         " stderr=subprocess.DEVNULL).pid)" % (SLEEP,)],
        capture_output=True, text=True, check=True,
    )
    Path(os.environ["LEAK_PIDS"]).write_text(f"{child.pid} {spawner.stdout.strip()}")
"""

PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "tests.support.stragglers", "-p", "no:cacheprovider"]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if alive(p.pid)}


@pytest.mark.parametrize("workers", [["-p", "no:xdist"], ["-n", "2"]], ids=["one-process", "xdist-workers"])
def test_a_process_left_running_by_a_test_fails_the_run_and_is_killed(tmp_path: Path, workers: list[str]) -> None:
    (tmp_path / "test_leaky.py").write_text(LEAKY_MODULE)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    pids_file, log = tmp_path / "pids", tmp_path / "inner.log"
    with log.open("w") as output:  # a file, not a pipe: a leaked process would hold a pipe open
        inner = subprocess.run(
            [
                *PYTEST,
                *workers,
                "-c",
                str(tmp_path / "pytest.ini"),
                "--rootdir",
                str(tmp_path),
                str(tmp_path / "test_leaky.py"),
            ],
            cwd=ROOT,
            env={**os.environ, "LEAK_PIDS": str(pids_file)},
            stdout=output,
            stderr=subprocess.STDOUT,
            timeout=bound(60),
        )
    pids = [int(p) for p in pids_file.read_text().split()]
    leaked = [pid for pid in pids if alive(pid)]
    for pid in leaked:  # this test must not leak them either
        psutil.Process(pid).kill()
    out = log.read_text()
    assert "1 passed" in out, out  # the test passed; the run fails
    assert inner.returncode == pytest.ExitCode.TESTS_FAILED, out
    assert not leaked, f"still running after the inner run: {leaked}\n{out}"
    assert "processes that outlived their tests" in out, out
    for pid in pids:
        assert f"pid {pid}: " in out, out


def test_a_stack_whose_service_exits_at_start_raises_and_leaves_no_process(tmp_path: Path) -> None:
    before = descendants()
    stack = LocalStack(state_dir=tmp_path, env={**TEST_ENV, "LW_ACK_WAIT_S": "soon"}, services=("judge",))
    try:
        with pytest.raises(StackError, match="judge exited with code 2"):
            stack.start()
        assert stack.procs == [] and stack.nats_url is None
        assert descendants() - before == set()
    finally:
        stack.stop()


def test_a_stack_never_ready_raises_within_its_setting_naming_it_and_leaves_no_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ready_s = bound(3)
    monkeypatch.setenv("LW_STACK_READY_TIMEOUT_S", f"{ready_s:g}")
    before = descendants()
    # with streams managed elsewhere and no bootstrap coming, the service waits for it and is never ready
    stack = LocalStack(
        state_dir=tmp_path, env={**TEST_ENV, "LW_MANAGE_STREAMS": "false", "LW_INFRA_WAIT_S": "0"}, services=("judge",)
    )
    started = time.monotonic()
    try:
        with pytest.raises(StackError) as raised:
            stack.start()
        took = time.monotonic() - started
        assert f"not ready after {ready_s:g}s (LW_STACK_READY_TIMEOUT_S): judge" in str(raised.value)
        assert took < ready_s + bound(15), f"took {took:.1f}s"  # the wait, then stopping what it started
        assert stack.procs == []
        assert descendants() - before == set()
    finally:
        stack.stop()
