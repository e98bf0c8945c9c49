"""Where nats-server's memory goes over many runs with retention sweeping (issue 28, edge 6).

Not part of ``make test`` or ``make bench``: it runs for as long as it is told (longer than the
de-duplication window to see that window fill and level off). Its own nats-server, with the monitoring
port, one replica of each service, the demo scenario ``batch`` runs at a time, and the retention sweep
(retention 0 s) after every batch; after each batch it samples the server's resident set (``/proc``), its
``/varz`` (``mem``) and ``/jsz?streams=1&consumers=1`` (per stream: messages, bytes, interior deletes,
subjects; consumers: pending, redelivered, waiting).

    .venv/bin/python -m bench.soak --seconds 900                  # the configured windows
    .venv/bin/python -m bench.soak --seconds 900 --window 600     # every stream's window 10 minutes

Prints one line per sample and a summary: MB of resident memory per 1,000 runs over the whole soak and
after the first window (once the de-duplication map is as full as it gets), and which streams held
what at the end. ``--json PATH`` writes every sample too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.storage import _sweep, demo, rss_bytes
from loopwarden.client import Client
from loopwarden.stack import LocalStack, free_port, nats_server_binary, open_log, wait_for_port
from shared.settings import Settings


@dataclass
class Sample:
    seconds: float
    runs: int
    rss: int
    varz_mem: int
    streams: dict[str, dict[str, int]] = field(default_factory=dict)
    windows: dict[str, float] = field(default_factory=dict)  # each stream's de-duplication window, seconds
    consumers: dict[str, dict[str, int]] = field(default_factory=dict)


def monitor(port: int, endpoint: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/{endpoint}", timeout=10) as reply:
        data: dict[str, Any] = json.loads(reply.read())
        return data


def sample(mport: int, pid: int, started: float, runs: int) -> Sample:
    varz = monitor(mport, "varz")
    jsz = monitor(mport, "jsz?streams=1&consumers=1&config=1")
    s = Sample(round(time.monotonic() - started, 1), runs, rss_bytes(pid), int(varz.get("mem", 0)))
    for account in jsz.get("account_details") or []:
        for stream in account.get("stream_detail") or []:
            state = stream.get("state") or {}
            s.windows[stream["name"]] = int((stream.get("config") or {}).get("duplicate_window", 0)) / 1e9
            s.streams[stream["name"]] = {
                "messages": int(state.get("messages", 0)),
                "bytes": int(state.get("bytes", 0)),
                "deleted": int(state.get("num_deleted", 0)),
                "subjects": int(state.get("num_subjects", 0)),
            }
            for consumer in stream.get("consumer_detail") or []:
                s.consumers[f"{stream['name']}/{consumer['name']}"] = {
                    "pending": int(consumer.get("num_pending", 0)),
                    "ack_pending": int(consumer.get("num_ack_pending", 0)),
                    "redelivered": int(consumer.get("num_redelivered", 0)),
                    "waiting": int(consumer.get("num_waiting", 0)),
                }
    return s


def start_server(state: Path) -> tuple[subprocess.Popen[bytes], str, int]:
    port, mport = free_port(), free_port()
    store = state / "jetstream"
    store.mkdir(parents=True, exist_ok=True)
    log = state / "logs" / "nats-server.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    out = open_log(log)
    args = ["-js", "-a", "127.0.0.1", "-p", str(port), "-m", str(mport), "-sd", str(store)]
    popen = subprocess.Popen([nats_server_binary(), *args], stdout=out, stderr=subprocess.STDOUT)
    out.close()
    wait_for_port(port)
    wait_for_port(mport)
    return popen, f"nats://127.0.0.1:{port}", mport


def soak(seconds: float, window_s: float | None, batch: int) -> list[Sample]:
    state = Path(tempfile.mkdtemp(prefix="lw-soak-"))
    server, url, mport = start_server(state)
    env = {"LW_RETENTION_RUNS_S": "0", "LW_RETENTION_ESCALATIONS_S": "0"}
    if window_s is not None:  # every stream's window (else: the settings' windows)
        env |= {"LW_DUPLICATE_WINDOW_S": str(window_s), "LW_REDELIVERY_WINDOW_S": str(window_s)}
    stack = LocalStack(
        state_dir=state,
        nats_url=url,
        services=("planner", "executor", "validator", "judge", "governor", "escalation"),
        env=env,
    )
    samples: list[Sample] = []
    try:
        stack.start()

        async def main() -> None:
            windows = {} if window_s is None else {"duplicate_window_s": window_s, "redelivery_window_s": window_s}
            settings = Settings.model_validate({"nats_url": url, "retention_runs_s": 0.0, **windows})
            async with Client(settings) as client:
                scenario = demo()

                async def one() -> str:
                    run_id = await client.submit_scenario(scenario)
                    return (await client.wait(run_id, timeout=300)).status

                statuses: dict[str, int] = {}

                await asyncio.gather(*(one() for _ in range(4)))  # warm-up: streams, buckets, contracts
                await _sweep(client, settings)
                started, runs = time.monotonic(), 0
                samples.append(sample(mport, server.pid, started, runs))
                print(line(samples[-1], samples[0]), flush=True)
                while time.monotonic() - started < seconds:
                    ended = await asyncio.gather(*(one() for _ in range(batch)))
                    runs += len(ended)
                    for status in ended:
                        statuses[status] = statuses.get(status, 0) + 1
                    await _sweep(client, settings)
                    samples.append(sample(mport, server.pid, started, runs))
                    print(line(samples[-1], samples[0]), flush=True)
                print(f"run outcomes: {dict(sorted(statuses.items()))}", flush=True)

        asyncio.run(main())
    finally:
        stack.stop()
        server.terminate()
        server.wait(15)
    return samples


def line(s: Sample, first: Sample) -> str:
    stored = sum(v["messages"] for v in s.streams.values())
    deleted = sum(v["deleted"] for v in s.streams.values())
    subjects = sum(v["subjects"] for v in s.streams.values())
    return (
        f"{s.seconds:7.0f} s {s.runs:6d} runs  rss {s.rss / 1e6:6.1f} MB ({(s.rss - first.rss) / 1e6:+6.1f})  "
        f"varz.mem {s.varz_mem / 1e6:6.1f} MB  stored msgs {stored:6d}  interior deletes {deleted:7d}  "
        f"subjects {subjects:6d}"
    )


def per_thousand(a: Sample, b: Sample) -> float:
    return (b.rss - a.rss) / 1e6 * 1000 / max(1, b.runs - a.runs)


def summary(samples: list[Sample]) -> list[str]:
    first, last = samples[0], samples[-1]
    windows = {name: w for name, w in last.windows.items() if not name.startswith("KV_")}
    window_s = max(windows.values(), default=0.0)
    out = [
        f"soak: {last.runs} runs in {last.seconds:.0f} s; de-duplication windows (s) {windows}",
        f"  nats-server RSS {first.rss / 1e6:.1f} -> {last.rss / 1e6:.1f} MB = "
        f"{per_thousand(first, last):+.1f} MB per 1,000 runs over the whole soak",
    ]
    settled = next((s for s in samples if s.seconds >= window_s), None)
    if settled is not None and settled is not last:
        out.append(
            f"  after the first window (from {settled.seconds:.0f} s, run {settled.runs}): "
            f"{settled.rss / 1e6:.1f} -> {last.rss / 1e6:.1f} MB = {per_thousand(settled, last):+.1f} MB per 1,000 runs"
        )
    out.append(f"  {'stream':24} {'msgs':>7} {'bytes':>10} {'deleted':>8} {'subjects':>8}")
    for name, v in sorted(last.streams.items(), key=lambda kv: -kv[1]["deleted"] - kv[1]["messages"]):
        if any(v.values()):
            out.append(f"  {name:24} {v['messages']:7d} {v['bytes']:10d} {v['deleted']:8d} {v['subjects']:8d}")
    busy = {k: v for k, v in last.consumers.items() if v["pending"] or v["ack_pending"] or v["redelivered"]}
    out.append(f"  consumers {len(last.consumers)}, with anything pending: {busy or 'none'}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=900.0, help="how long to run runs (default 900)")
    parser.add_argument("--window", type=float, help="every stream's de-duplication window (default: the settings')")
    parser.add_argument("--batch", type=int, default=20, help="runs at a time")
    parser.add_argument("--json", type=Path, help="write every sample here")
    args = parser.parse_args()
    samples = soak(args.seconds, args.window, args.batch)
    print("\n".join(summary(samples)), flush=True)
    if args.json:
        args.json.write_text(json.dumps([asdict(s) for s in samples], indent=1))


if __name__ == "__main__":
    os.environ.setdefault("LW_LOG_LEVEL", "WARNING")
    main()
