"""The provider's rate limit, fleet-wide (issue 34, item 3): many runs on two planner replicas against a
Messages-API stand-in that enforces a rate limit, with no rate-limit setting.

The stand-in (``loopwarden fake-model --requests-per-s 10``, a process of its own) allows 10 requests and 20,000
input tokens a second, each a token bucket of one second's capacity; beyond it a request is answered 429
with ``retry-after``; every answer announces the limits in Anthropic's headers. Each run is three model
turns of the stand-in's default agent (it calls ``search``, then ``exchange_rate``, then ``submit_result``). The
planners learn the limits from the headers and pace every call fleet-wide.

Figures: the share of requests answered 429 (target <= 2 %), the achieved rate against the limit
(requests and input tokens a second, from the first request to the last; target >= 85 % of the limit
that binds), the runs' outcomes (target: all completed, none waiting for a person), and the waits.
``fleet=False`` runs the same with ``LW_RATE_LIMIT_FLEET=false`` (each call retries its own 429s): the
behaviour before, for comparison.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from loopwarden.client import Client
from loopwarden.stack import LocalStack
from shared.messages import RunLimits, RunSnapshot, RunSubmit
from shared.settings import Settings

REQUESTS_PER_S = 10.0
INPUT_TOKENS_PER_S = 20_000.0
TURNS = 3
SERVICES = ("planner", "planner", "executor", "validator", "judge", "governor", "escalation")


def stack_env(base_url: str, fleet: bool) -> dict[str, str]:
    return {
        "LW_LOG_LEVEL": "INFO",  # the planners' logs count the calls woken late
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": f"bench-{uuid.uuid4().hex[:8]}",
        "LW_PLANNER_PROVIDER": "anthropic",
        "LW_RATE_LIMIT_FLEET": "true" if fleet else "false",
    }


class StandIn:
    """``loopwarden fake-model`` with the rate limit, as a process of its own (not sharing this process's
    interpreter with the client's 200 waits: its arrival times are when requests came, not when a busy
    process got round to them); ``stats()`` reads what it answered (``GET /stats``)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "loopwarden.cli",
                "fake-model",
                "--port",
                "0",
                "--requests-per-s",
                f"{REQUESTS_PER_S:g}",
                "--input-tokens-per-s",
                f"{INPUT_TOKENS_PER_S:g}",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline()
        found = re.search(r"on (http://\S+)", first)
        if found is None:
            self.stop()
            raise RuntimeError(f"fake-model did not start: {first!r}")
        self.base_url = found.group(1)

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.base_url}/stats", timeout=30) as answer:  # loopback only
            stats: dict[str, Any] = json.load(answer)
            return stats

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


async def _runs(client: Client, runs: int, timeout: float) -> tuple[list[RunSnapshot], float]:
    tag = uuid.uuid4().hex[:6]
    ids = [f"rl-{tag}-{i}" for i in range(runs)]
    started = time.monotonic()
    await asyncio.gather(
        *(
            client.submit(
                RunSubmit(
                    run_id=run_id,
                    task="Look up JetStream de-duplication and the euro's rate, then submit what you found.",
                    tools=["search", "exchange_rate"],
                    limits=RunLimits(max_iterations=TURNS + 2),
                )
            )
            for run_id in ids
        )
    )
    done = await asyncio.gather(*(client.wait(run_id, timeout=timeout, history=False) for run_id in ids))
    return list(done), time.monotonic() - started


def run(runs: int = 200, fleet: bool = True, timeout: float = 900.0) -> dict[str, Any]:
    fake = StandIn()
    stack = LocalStack(
        state_dir=Path(tempfile.mkdtemp(prefix="lw-bench-ratelimit-")),
        env=stack_env(fake.base_url, fleet),
        services=SERVICES,
    )
    try:
        stack.start()

        async def main() -> tuple[list[RunSnapshot], float]:
            async with Client(Settings(nats_url=stack.nats_url)) as client:
                return await _runs(client, runs, timeout)

        snapshots, wall_s = asyncio.run(main())
        stats = fake.stats()
    finally:
        stack.stop()
        fake.stop()
    logs = [p.log.read_text(errors="replace") for p in stack.procs if p.service == "planner"]
    late = sum(text.count("after its slot") for text in logs)
    arrivals = sorted((float(t), int(status)) for t, status in stats["arrivals"])
    answered = [t for t, status in arrivals if status == 200]
    span = (arrivals[-1][0] - arrivals[0][0]) if len(arrivals) > 1 else 0.0
    statuses = Counter(s.status for s in snapshots)
    waited = [s.rate_limited_s for s in snapshots]
    return {
        "runs": runs,
        "fleet": fleet,
        "requests": len(arrivals),
        "answered": len(answered),
        "rejected": sum(1 for _, status in arrivals if status == 429),
        "span_s": span,
        "wall_s": wall_s,
        "request_rate": (len(answered) - 1) / span if span else 0.0,
        "steady_rate": _steady(answered),
        "tokens_rate": stats["charged_input_tokens"] / span if span else 0.0,
        "statuses": dict(statuses),
        "turns": sum(s.model_calls for s in snapshots),
        "waited_p50_s": statistics.median(waited) if waited else 0.0,
        "waited_max_s": max(waited, default=0.0),
        "late": late,
        "reasons": Counter((s.final_reason or "")[:80] for s in snapshots if s.status != "completed"),
        # when the 429s came, in tenths of the span (first request to last)
        "rejected_by_tenth": _tenths([t for t, status in arrivals if status == 429], arrivals[0][0], span)
        if arrivals
        else [],
        "sent_by_tenth": _tenths([t for t, _ in arrivals], arrivals[0][0], span) if arrivals else [],
        "gaps_s": sum(b - a - 1 / REQUESTS_PER_S for a, b in itertools.pairwise(t for t, _ in arrivals) if b - a > 0.3),
    }


def _steady(times: list[float]) -> float:
    """The rate between the 10th and the 90th percentile answer: without the ramp (the first turns of 200
    runs being started) and the tail (the last runs' last turns)."""
    if len(times) < 10:
        return 0.0
    lo, hi = len(times) // 10, len(times) * 9 // 10
    return (hi - lo) / (times[hi] - times[lo]) if times[hi] > times[lo] else 0.0


def _tenths(times: list[float], start: float, span: float) -> list[int]:
    out = [0] * 10
    for t in times:
        out[min(9, int((t - start) / span * 10)) if span else 0] += 1
    return out


def report(r: dict[str, Any]) -> list[str]:
    share = r["rejected"] / r["requests"] if r["requests"] else 0.0
    of_limit, steady = r["request_rate"] / REQUESTS_PER_S, r["steady_rate"] / REQUESTS_PER_S
    mode = "fleet-wide limit (no setting)" if r["fleet"] else "LW_RATE_LIMIT_FLEET=false (each call retries alone)"
    outcomes = ", ".join(f"{n} {status}" for status, n in sorted(r["statuses"].items()))
    lines = [
        f"ratelimit: {r['runs']} runs x {TURNS} turns on 2 planner replicas against a stand-in enforcing "
        f"{REQUESTS_PER_S:g} requests/s and {INPUT_TOKENS_PER_S:,.0f} input tokens/s; {mode}:",
        f"  requests sent           {r['requests']:>6}   for {r['turns']} turns taken",
        f"  answered 429            {r['rejected']:>6}   {share:6.2%} of requests   (target <= 2%)",
        f"  achieved rate           {r['request_rate']:6.2f} requests/s   {of_limit:6.1%} of the limit   "
        f"(target >= 85%; first request to last, {r['span_s']:.1f}s)",
        f"  steady rate             {r['steady_rate']:6.2f} requests/s   {steady:6.1%} of the limit   "
        "(10th to 90th percentile answer)",
        f"  input tokens charged    {r['tokens_rate']:8,.0f} /s   "
        f"{r['tokens_rate'] / INPUT_TOKENS_PER_S:6.1%} of the token limit (answered requests, as the stand-in counts)",
        f"  run outcomes            {outcomes}   (target: all completed, none waiting for a person)",
        f"  waited for the limit    p50 {r['waited_p50_s']:.1f}s, max {r['waited_max_s']:.1f}s per run; "
        f"all runs done in {r['wall_s']:.1f}s",
        f"  calls woken late        {r['late']:>6}   (> 0.5 s after their slot: each took another)",
    ]
    lines.append(
        f"  requests by tenth       {' '.join(str(n) for n in r['sent_by_tenth'])}   (the span in ten parts; "
        f"{r['gaps_s']:.1f}s lost in gaps over 0.3 s)"
    )
    if r["rejected"]:
        lines.append(f"  429s by tenth           {' '.join(str(n) for n in r['rejected_by_tenth'])}")
    lines += [f"  not completed: {n} x {reason}" for reason, n in r["reasons"].most_common(5)]
    return lines
