"""The regression guard (issue 36): each headline figure of this ``make bench`` against the figures recorded
for the last release in docs/benchmarks.md, marked where it got worse by more than 15 %.

Times are compared as ratios to an in-process floor measured in the same invocation (a slower or busier
machine moves both), counts and bytes as they are. The recorded figures are the fenced block that starts
with ```` ```bench-release <version> ```` in docs/benchmarks.md: one ``<figure> <value>`` per line, ``#``
comments allowed; a new release's ``make bench`` figures replace it (``python -m bench`` prints the
block to paste, ``recorded_block``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
WORSE_BY = 0.15

# figure -> what it is (every one: lower is better)
HEADLINES: dict[str, str] = {
    "step_1run_10": "a step, 1 run of 10 steps / PydanticAI in one process (x)",
    "step_1run_40": "a step, 1 run of 40 steps / PydanticAI in one process (x)",
    "step_16runs": "a step, 16 runs at once / PydanticAI in one process (x)",
    "round_trips": "round trips per step (count)",
    "server_msgs": "messages into nats-server per step (count)",
    "cpu_step": "CPU per step, all processes, 1 run / PydanticAI's step (x)",
    "cpu_1run": "CPU per step at 1 run / own in-process step (x)",
    "cpu_64runs": "CPU per step at 64 runs / own in-process step (x)",
    "step80_10": "step 80 / step 10 (x)",
    "overlap_16": "16 runs of 1 s turns / one run (x)",
    "stored_bytes": "bytes stored per demo run, before the sweep",
}


def recorded(text: str | None = None) -> tuple[str, dict[str, float]]:
    """(the release, its figures) from docs/benchmarks.md (``("", {})`` when it records none)."""
    text = DOC.read_text() if text is None else text
    match = re.search(r"^```bench-release[ \t]*(\S*)[ \t]*\n(.*?)^```", text, re.M | re.S)
    if match is None:
        return "", {}
    figures: dict[str, float] = {}
    for line in match.group(2).splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, value = line.split()[:2]
        figures[name] = float(value)
    return match.group(1), figures


def from_step(r: dict[str, Any]) -> dict[str, float]:
    """The headline figures of ``bench.step.run``."""
    from bench.step import round_trips

    side = r["side"]
    lw = side["loopwarden"]
    floor = side.get("pydanticai")
    out = {"round_trips": round_trips(r["ops"]), "server_msgs": r["server_in"]}
    if floor is not None:
        out["step_1run_10"] = lw[(1, 10)] / floor[(1, 10)]
        out["step_1run_40"] = lw[(1, 40)] / floor[(1, 40)]
        out["step_16runs"] = lw[(16, 10)] / floor[(16, 10)]
        out["cpu_step"] = sum(r["cpu_ms"].values()) / floor[(1, 10)]
    return out


def from_throughput(r: dict[str, Any]) -> dict[str, float]:
    floor, top = r["floor_p50_ms"], r["levels"][-1]
    out = {
        "cpu_1run": r["cpu_ms_1"] / floor,
        "step80_10": r["stepN_ms"] / r["step10_ms"],
        "overlap_16": r["lat_some_s"] / r["lat_single_s"],
    }
    if top == 64:
        out["cpu_64runs"] = r["cpu_ms_64"] / floor
    return out


def report(measured: dict[str, float], text: str | None = None) -> list[str]:
    release, before = recorded(text)
    if not before:
        return ["regression guard: docs/benchmarks.md records no release's figures (a ```bench-release block)"]
    lines = [
        f"regression guard: this run against release {release or '?'} (docs/benchmarks.md); "
        f"worse by more than {WORSE_BY:.0%} is marked",
        f"  {'figure':62} {'release':>9} {'now':>9} {'change':>8}",
    ]
    worse = 0
    for name, what in HEADLINES.items():
        if name not in measured:
            continue
        now, then = measured[name], before.get(name)
        if then is None or then == 0:
            lines.append(f"  {what:62} {'-':>9} {now:9.2f}")
            continue
        change = now / then - 1
        mark = "  WORSE" if change > WORSE_BY else ""
        worse += change > WORSE_BY
        lines.append(f"  {what:62} {then:9.2f} {now:9.2f} {change:+8.0%}{mark}")
    lines.append(f"  {worse} figure(s) worse by more than {WORSE_BY:.0%}" if worse else "  none worse by more than 15%")
    return lines


def recorded_block(measured: dict[str, float], release: str) -> list[str]:
    """The block to record in docs/benchmarks.md for ``release``."""
    return [f"```bench-release {release}", *(f"{k} {v:.3f}" for k, v in measured.items()), "```"]
