"""Overload (issue 34, item 5): far more runs than the fleet serves, submitted in one burst.

Two planner and two executor replicas; several tenants each submit their share of ``n`` runs at once (plain
JetStream publishes on each tenant's subject, all before the first is answered), with a per-tenant quota on
runs queued, running or waiting for a person (``LW_QUOTA_RUNS``). Every run must complete, or be refused at
the door with its reason; none may be lost (a run with no final record when everything has settled). Reported:
how many completed and were refused (by quota), none lost, the submit's answer latency (from its publish to
the planner's answer: ``run.queued``, ``run.started`` or ``run.refused``) p50/p99, throughput, and the peak
resident memory of nats-server and of every service process (``VmHWM``).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.fairness import TWO_TWO, pct, submit_of, two_turns
from loopwarden.client import Client, submit_id
from loopwarden.stack import LocalStack
from shared import subjects as S
from shared.bus import RUN_ID_HEADER
from shared.messages import FINAL_STATUSES, RunSnapshot
from shared.settings import Settings

ANSWERS = ("queued", "started", "refused")


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident set (``VmHWM``), in MB; 0 if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


async def settle(client: Client, run_ids: list[str], deadline: float) -> dict[str, RunSnapshot | None]:
    """Every run's record once each is final (or the deadline passed): read 200 at a time."""
    found: dict[str, RunSnapshot | None] = {}
    pending = list(run_ids)
    sem = asyncio.Semaphore(200)

    async def read(rid: str) -> None:
        async with sem:
            found[rid] = await client.state(rid)

    while pending:
        await asyncio.gather(*(read(r) for r in pending))
        pending = [r for r in pending if (s := found.get(r)) is None or s.status not in FINAL_STATUSES]
        if not pending or time.monotonic() > deadline:
            return found
        await asyncio.sleep(2.0)
    return found


def run(
    n: int = 20_000, tenants: int = 4, quota: int = 2_000, model_s: float = 0.0, timeout: float = 1800
) -> dict[str, Any]:
    env = {"LW_LOG_LEVEL": "WARNING", "LW_QUOTA_RUNS": str(quota)}
    stack = LocalStack(state_dir=Path(tempfile.mkdtemp(prefix="lw-bench-overload-")), env=env, services=TWO_TWO)
    r: dict[str, Any] = {"n": n, "tenants": tenants, "quota": quota, "load_before": os.getloadavg()[0]}
    stack.start()
    try:

        async def main() -> None:
            async with Client(Settings(nats_url=stack.nats_url)) as client:
                answered: dict[str, float] = {}
                answer_kind: dict[str, str] = {}

                async def on_answer(msg: Any) -> None:
                    rid = (msg.headers or {}).get(RUN_ID_HEADER, "") or msg.subject.rsplit(".", 1)[-1]
                    if rid not in answered:
                        answered[rid] = time.perf_counter()
                        answer_kind[rid] = msg.subject.split(".")[4]

                for kind in ANSWERS:
                    await client.bus.nc.subscribe(S.any_run(S.run_event(kind)), cb=on_answer)
                scenario = two_turns(model_s)
                submits = [(f"t{k % tenants}", submit_of(scenario)) for k in range(n)]
                sent: dict[str, float] = {}

                async def send(tenant: str, submit: Any) -> None:
                    sent[submit.run_id] = time.perf_counter()
                    await client.bus.publish(S.run_submit(tenant), submit, msg_id=submit_id(submit.run_id))

                t0 = time.perf_counter()
                for k in range(0, n, 2000):  # the client's own pipeline: 2,000 publishes in flight at a time
                    await asyncio.gather(*(send(t, s) for t, s in submits[k : k + 2000]))
                r["publish_s"] = time.perf_counter() - t0
                ids = [s.run_id for _, s in submits]
                deadline = time.monotonic() + timeout
                while len(answered) < n and time.monotonic() < deadline:  # noqa: ASYNC110 (a progress poll)
                    await asyncio.sleep(0.5)
                r["answered_s"] = time.perf_counter() - t0
                latencies = [answered[rid] - sent[rid] for rid in ids if rid in answered]
                r["answer_p50_s"], r["answer_p99_s"] = pct(latencies, 0.5), pct(latencies, 0.99)
                r["answer_max_s"] = max(latencies) if latencies else 0.0
                r["unanswered"] = n - len(latencies)
                records = await settle(client, ids, deadline)
                r["wall_s"] = time.perf_counter() - t0
                statuses = Counter((s.status if s is not None else "lost") for s in records.values())
                r["statuses"] = dict(statuses)
                refused = [s for s in records.values() if s is not None and s.status == "refused"]
                r["refused_by"] = dict(
                    Counter((s.refusal.quota or "other") if s.refusal else "no reason" for s in refused)
                )
                r["refused_without_reason"] = sum(1 for s in refused if s.refusal is None or not s.refusal.reason)
                r["lost"] = sum(1 for s in records.values() if s is None or s.status not in FINAL_STATUSES)

        asyncio.run(main())
        names, seen = Counter(p.name for p in stack.procs), Counter[str]()
        r["peak_rss_mb"] = {}
        for p in stack.procs:  # one figure per process: replicas numbered
            seen[p.name] += 1
            r["peak_rss_mb"][p.name if names[p.name] == 1 else f"{p.name}-{seen[p.name]}"] = peak_rss_mb(p.popen.pid)
    finally:
        stack.stop()
    r["load_after"] = os.getloadavg()[0]
    return r


def report(r: dict[str, Any]) -> list[str]:
    st = r["statuses"]
    done = st.get("completed", 0)
    rss = ", ".join(f"{k} {v:.0f}" for k, v in r["peak_rss_mb"].items())
    ok = r["lost"] == 0 and r["refused_without_reason"] == 0 and r["unanswered"] == 0
    return [
        f"overload: {r['n']} runs submitted at once by {r['tenants']} tenants (quota {r['quota']} runs each), "
        f"2 planner + 2 executor replicas; machine load average {r['load_before']:.1f} before, {r['load_after']:.1f} "
        "after",
        f"  published in {r['publish_s']:.1f} s; every submit answered after {r['answered_s']:.1f} s; all settled "
        f"after {r['wall_s']:.1f} s ({done / max(r['wall_s'], 1e-9):.0f} completed runs/s)",
        f"  outcome: {done} completed, {st.get('refused', 0)} refused at the door ({r['refused_by']}), other ends "
        f"{ {k: v for k, v in st.items() if k not in ('completed', 'refused')} }, lost {r['lost']}, "
        f"refused without a reason {r['refused_without_reason']}   target 0 lost: {'met' if ok else 'MISSED'}",
        f"  submit answered (publish -> queued/started/refused): p50 {r['answer_p50_s']:.2f} s, p99 "
        f"{r['answer_p99_s']:.2f} s, max {r['answer_max_s']:.2f} s; unanswered {r['unanswered']}",
        f"  peak resident memory (MB): {rss}",
    ]


if __name__ == "__main__":
    print("\n".join(report(run())))
