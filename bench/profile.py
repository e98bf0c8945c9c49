"""A sampling profile of the services while they run steps (``python -m bench --only step --profile DIR``):
py-spy (a dev dependency) attached to every service process at once, ``--nonblocking`` (the process is
not paused to read its stacks), its collapsed stacks kept in DIR, summarised here by cause - the
innermost frame that belongs to a known cause (pydantic, socket writes, nats-py, the event loop, ...) - and
by the hottest functions of our own code (inclusive). Idle samples are not taken (py-spy's default).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

RATE = 100  # samples per second

# (cause, what a frame's "function (file)" contains): the first cause from the innermost frame out wins
CAUSES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("socket writes (nats-py's flusher)", ("writelines", "socket.py", "sendall")),
    # the innermost Python frame is the loop's own: uvloop (C) polling, reading sockets, running callbacks
    ("event loop (poll, read, wake-ups)", ("runners.py", "base_events.py", "uvloop/")),
    ("pydantic validate/serialize", ("pydantic", "model_validate", "model_dump")),
    ("json", ("json/",)),
    ("tiktoken", ("tiktoken",)),
    ("OpenTelemetry", ("opentelemetry",)),
    ("nats-py client", ("nats/",)),
    ("faststream / anyio", ("faststream", "fast_depends", "anyio")),
    ("asyncio", ("asyncio/",)),
    ("own code (shared/, services/)", ("shared/", "services/")),
)


def py_spy() -> str | None:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    return found if Path(found).exists() else None


def start(pids: dict[str, int], seconds: float, out: Path) -> list[subprocess.Popen[bytes]]:
    exe = py_spy()
    if exe is None:
        raise RuntimeError("py-spy is not installed (a dev dependency: make install)")
    out.mkdir(parents=True, exist_ok=True)
    return [
        subprocess.Popen(
            [
                *(exe, "record", "--nonblocking", "-r", str(RATE), "-d", str(int(seconds)), "-f", "raw"),
                *("-o", str(out / f"{name}.txt"), "--pid", str(pid)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, pid in pids.items()
    ]


def cause_of(frames: list[str]) -> str:
    for frame in reversed(frames):  # innermost last in py-spy's collapsed stacks
        for cause, marks in CAUSES:
            if any(m in frame for m in marks):
                return cause
    return "other"


def summarise(path: Path) -> dict[str, Any]:
    """Per cause and per own function (inclusive) the share of a process's samples."""
    causes: Counter[str] = Counter()
    own: Counter[str] = Counter()  # inclusive, of the functions below the delivery and request plumbing
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        total += n
        causes[cause_of(frames)] += n
        for f in {f for f in frames if ("shared/" in f or "services/" in f) and not any(p in f for p in PLUMBING)}:
            own[f.split(" (")[0] + " (" + f.split("/")[-1].split(":")[0].rstrip(")") + ")"] += n
    return {"samples": total, "causes": causes, "own": own}


# frames every handled message passes through (their inclusive time is the whole process's)
PLUMBING = ("service.py", "__main__.py", "pulls.py", "consuming.py", "Requests._answer", "app.py")


def report(out: Path, cpu_ms: dict[str, float], runs: int = 16) -> list[str]:
    """The profile in DIR, as ms per step (each process's share of its CPU per step, ``cpu_ms``)."""
    lines = [
        f"profile (py-spy {RATE} Hz, --nonblocking, {runs} run(s) at once; collapsed stacks in {out}): CPU per step "
        + ", ".join(f"{n} {v:.2f}" for n, v in cpu_ms.items())
        + " ms; by cause, ms per step:"
    ]
    summaries = {p.stem: summarise(p) for p in sorted(out.glob("*.txt"))}
    names = [n for n in summaries if summaries[n]["samples"]]
    causes = [c for c, _ in CAUSES] + ["other"]
    lines.append("  " + f"{'cause':34}" + "".join(f"{n:>11}" for n in names))
    for cause in causes:
        row = []
        for n in names:
            s = summaries[n]
            row.append(s["causes"][cause] / s["samples"] * cpu_ms.get(n, 0.0))
        if any(v >= 0.01 for v in row):
            lines.append("  " + f"{cause:34}" + "".join(f"{v:11.2f}" for v in row))
    for n in names:
        s = summaries[n]
        top = ", ".join(f"{f} {c / s['samples'] * cpu_ms.get(n, 0.0):.2f}" for f, c in s["own"].most_common(6))
        lines.append(f"  {n} hottest own functions (inclusive ms/step): {top}")
    return lines
