"""Run a command (the test suite) while CPU burners load the machine, and count processes before and after.

``make test-loaded`` runs ``python -m tests.support.loaded -- <pytest command>``: it starts twice as many
burners as there are cores (``stress-ng --cpu N`` where installed, else busy Python processes), runs the
command, stops the burners by pid, and prints how many processes of this checkout (nats-servers, services,
consoles, pytest) ran before and after. It exits with the command's status, or 1 if processes of this
checkout were left running.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tests.support.timing import bound

ROOT = Path(__file__).resolve().parents[2]
BURN = "import time\nwhile True:\n    time.perf_counter()\n"


def of_checkout(proc: psutil.Process) -> bool:
    """A process started from this checkout: its command line names a path inside it, or it runs there."""
    try:
        cmdline = " ".join(proc.cmdline())
        return str(ROOT) in cmdline or proc.cwd() == str(ROOT)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def census(exclude: set[int]) -> tuple[int, list[str]]:
    """All processes on the machine, and those of this checkout (names, for the report)."""
    total, ours = 0, []
    for proc in psutil.process_iter():
        total += 1
        if proc.pid not in exclude and of_checkout(proc):
            try:
                ours.append(f"{proc.pid} {' '.join(proc.cmdline())[:120]}")
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
    return total, ours


def start_burners(count: int) -> list[subprocess.Popen[bytes]]:
    if shutil.which("stress-ng"):
        return [subprocess.Popen(["stress-ng", "--cpu", str(count), "--quiet"], start_new_session=True)]
    return [subprocess.Popen([sys.executable, "-c", BURN], start_new_session=True) for _ in range(count)]


def stop_burners(burners: list[subprocess.Popen[bytes]]) -> None:
    for burner in burners:
        with_children = [burner.pid, *(p.pid for p in psutil.Process(burner.pid).children(recursive=True))]
        for pid in with_children:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        try:
            burner.wait(bound(10))
        except subprocess.TimeoutExpired:
            os.killpg(burner.pid, signal.SIGKILL)  # its own session: stress-ng and its workers only
            burner.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--burners", type=int, default=2 * (os.cpu_count() or 1), help="default: 2 x cores")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="after --: what to run under load")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("name the command to run after --")
    me = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    total_before, ours_before = census(me)
    tool = "stress-ng --cpu" if shutil.which("stress-ng") else "python busy loops:"
    print(f"loaded run: {tool} {args.burners} burners on {os.cpu_count()} cores; load before {os.getloadavg()}")
    print(f"processes before: {total_before} on the machine, {len(ours_before)} of this checkout", flush=True)
    burners = start_burners(args.burners)
    started = time.monotonic()
    try:
        status = subprocess.run(command, cwd=ROOT).returncode
    finally:
        load = os.getloadavg()
        stop_burners(burners)
    took = time.monotonic() - started
    total_after, ours_after = census(me)
    print(f"loaded run: exit status {status} after {took / 60:.1f} min; load at the end {load}")
    print(f"processes before: {total_before} on the machine, {len(ours_before)} of this checkout")
    print(f"processes after:  {total_after} on the machine, {len(ours_after)} of this checkout")
    left = sorted(set(ours_after) - set(ours_before))
    for line in left:
        print(f"  left running: {line}")
    return status or (1 if left else 0)


if __name__ == "__main__":
    sys.exit(main())
