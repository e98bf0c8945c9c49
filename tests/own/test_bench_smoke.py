"""The short forms of the cost, storage, step and overload benchmarks run in every `make test`, so a change that
breaks `make bench` (a module reading a field that moved) fails here, not on a user's machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.timing import bound

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("only", "expected"),
    [
        ("cost", ["cost: 24-step scripted run", "budget check at step 24", "tools section, 30 tools"]),
        ("storage", ["storage per run: 40 demo runs", "retention sweep after each batch"]),
        # the step's counts, the side-by-side with the bus's floor (bench.bus_floor) and the regression guard
        (
            "step",
            [
                "round trips per step",
                "bus floor: as Loopwarden stores (10 stored a step)",
                "runs at once, ms, by process",
                "regression guard",
            ],
        ),
        # overload's short form: 1,000 runs at once, small quotas - every run completes or is refused with its reason
        ("overload", ["overload: 1000 runs submitted at once", "lost 0", "target 0 lost: met", "peak resident memory"]),
    ],
)
def test_the_benchmark_runs_in_its_short_form(only: str, expected: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--only", only],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=bound(300),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    for line in expected:
        assert line in proc.stdout, proc.stdout
