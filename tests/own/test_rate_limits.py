"""The providers' rate limits, fleet-wide (issue 34, item 3), end to end.

A stack of its own (two planner replicas) talks to its own Messages-API stand-in, which enforces a rate
limit and announces it in Anthropic's headers; the planners learn it with no setting. A scripted 429 then
pauses the key: the stand-in counts what it is sent during the pause, each replica's log shows its turns
waiting, the runs show the wait (events, record, ``loopwarden status``), and a run whose bound is shorter
than the pause ends typed. Settings (a cap over a learned limit, the bound itself) are driven through the
gate directly, against the same nats-server and a stand-in of their own.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import sys
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from opentelemetry.metrics import get_meter
from opentelemetry.trace import NoOpTracer

from loopwarden.client import Client
from loopwarden.fake_model import FakeModel, RateLimit
from loopwarden.stack import LocalStack
from shared import metrics as M
from shared.backoff import BackoffPolicy
from shared.bus import Bus
from shared.messages import ChatMessage, RunLimits, RunSnapshot, RunSubmit
from shared.providers.anthropic import AnthropicProvider
from shared.providers.base import ModelRequest, complete_with_retry
from shared.ratelimit.fleet import provider_keys
from shared.ratelimit.gate import RateLimiter, RateLimitWait
from shared.settings import Settings
from tests.support.promql import base_name, metric_names
from tests.support.stacks import TEST_ENV, running
from tests.support.timing import bound, eventually

ROOT = Path(__file__).resolve().parents[2]
PLANNERS = ("planner", "planner#2")
POLICY = BackoffPolicy(max_attempts=4, base_delay_s=0.01, max_delay_s=0.05, max_elapsed_s=10.0)


@pytest.fixture(scope="module")
def stand_in() -> Iterator[FakeModel]:
    server = FakeModel(rate_limit=RateLimit(requests_per_s=20, input_tokens_per_s=400_000)).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory, stand_in: FakeModel) -> Iterator[LocalStack]:
    env = {
        **TEST_ENV,
        "ANTHROPIC_BASE_URL": stand_in.base_url,
        "ANTHROPIC_API_KEY": f"rl-{uuid.uuid4().hex[:8]}",
        "LW_PLANNER_PROVIDER": "anthropic",
        "LW_RATE_LIMIT_NOTICE_S": "0.2",
        # two turns at a time per durable of a replica: ten runs' turns are shared by both replicas
        "LW_MAX_IN_FLIGHT_BY_SERVICE": json.dumps({"planner": 2}),
    }
    services = ("planner", "planner", "executor", "validator", "governor", "judge", "escalation")
    yield from running(LocalStack(state_dir=tmp_path_factory.mktemp("ratelimit"), env=env, services=services))


@pytest.fixture(scope="module")
async def limited_client(limited: LocalStack) -> AsyncIterator[Client]:
    async with Client(Settings(nats_url=limited.nats_url)) as c:
        yield c


@pytest.fixture(scope="module")
async def learned(limited_client: Client, stand_in: FakeModel) -> None:
    """One run first: the key's limits are learned from the stand-in's headers (no setting)."""
    [snapshot] = await submit_and_wait(limited_client, 1)
    assert snapshot.status == "completed", snapshot.final_reason


async def submit(client: Client, n: int, limits: RunLimits | None = None) -> list[str]:
    ids = [f"rl-{uuid.uuid4().hex[:10]}" for _ in range(n)]
    for run_id in ids:
        await client.submit(
            RunSubmit(
                run_id=run_id,
                task="Look up JetStream de-duplication, then submit what you found.",
                tools=["search"],
                limits=limits or RunLimits(),
            )
        )
    return ids


async def submit_and_wait(client: Client, n: int, limits: RunLimits | None = None) -> list[RunSnapshot]:
    ids = await submit(client, n, limits)
    return list(await asyncio.gather(*(client.wait(r, timeout=bound(90), history=False) for r in ids)))


def arm_429(stand_in: FakeModel, retry_after_s: float) -> float:
    """The stand-in answers its next request 429 with ``retry-after``; returns when it was armed."""
    stand_in.default_script.append(
        {
            "status": 429,
            "headers": {"retry-after": f"{retry_after_s:.3f}"},
            "error": {"type": "rate_limit_error", "message": "slow down (scripted)"},
        }
    )
    return time.time()


def rejected_since(stand_in: FakeModel, since: float) -> list[float]:
    return [t for t, status in list(stand_in.arrivals) if status == 429 and t >= since]


def log_since(stack: LocalStack, label: str, offsets: dict[str, int]) -> str:
    proc = next(p for p in stack.procs if p.name == label)
    return proc.log.read_bytes()[offsets[label] :].decode(errors="replace")


async def rate_limited_events(client: Client, run_id: str) -> list[dict[str, object]]:
    events = await client.events(run_id)
    return [e.payload["detail"] for e in events if e.kind == "run.rate_limited"]  # type: ignore[misc]


# --- a 429 pauses the key for every replica ---------------------------------------------------------------


async def test_a_429_pauses_the_key_for_every_replica_until_its_retry_after(
    limited: LocalStack, limited_client: Client, stand_in: FakeModel, learned: None
) -> None:
    # long enough that a replica starved of CPU for a few seconds (a loaded machine: one logged its heartbeats
    # 3.3 s late) still asks for a turn inside it, so both replicas are seen holding turns for the pause
    pause = bound(5)
    offsets = {p.name: p.log.stat().st_size for p in limited.procs if p.name in PLANNERS}
    armed = arm_429(stand_in, pause)
    snapshots = await submit_and_wait(limited_client, 10)
    assert [s.status for s in snapshots] == ["completed"] * 10, [s.final_reason for s in snapshots]

    [t429] = rejected_since(stand_in, armed)  # one 429 for the whole fleet, not one per caller
    seen = [t for t, _ in list(stand_in.arrivals) if t > t429]
    in_flight = [t for t in seen if t < t429 + bound(0.3)]  # sent before the pause was written
    during = [t for t in seen if t429 + bound(0.3) <= t < t429 + pause - 0.02]
    after = [t for t in seen if t >= t429 + pause - 0.02]
    assert during == [], f"{len(during)} requests during the {pause:g}s pause ({len(in_flight)} were in flight)"
    assert len(in_flight) <= 4, in_flight
    assert len(after) >= 10  # every run's turns went once the pause was over
    # both replicas held turns for the pause: the one that was answered 429 and the other one
    for label in PLANNERS:
        logged = log_since(limited, label, offsets)
        assert "for the rate limit" in logged and "(paused, plan call)" in logged, f"{label}: {logged[-2000:]}"
    paused = [
        s
        for s in snapshots
        if any(d["reason"] == "paused" for d in await rate_limited_events(limited_client, s.run_id))
    ]
    assert len(paused) >= 2
    assert all(s.rate_limited_s > 0 for s in paused)


# --- a wait is visible on the run ---------------------------------------------------------------------------


async def test_a_wait_is_shown_on_the_run_while_it_lasts(
    limited: LocalStack, limited_client: Client, stand_in: FakeModel, learned: None
) -> None:
    pause = bound(6)
    arm_429(stand_in, pause)
    [run_id] = await submit(limited_client, 1)

    async def waiting() -> list[dict[str, object]]:
        return [d for d in await rate_limited_events(limited_client, run_id) if d["reason"] == "paused"]

    [detail] = await eventually(waiting, what="the run's wait for the 429's pause", within=bound(20))
    assert detail["provider"] == "anthropic" and detail["purpose"] == "plan"
    assert pause * 0.5 <= float(detail["wait_s"]) <= pause  # type: ignore[arg-type]
    env = {**os.environ, "LW_NATS_URL": str(limited.nats_url)}
    status = await lw(env, "status", run_id)
    assert "waiting on:  the rate limit of anthropic key" in status and "paused by a 429" in status, status
    snapshot = await limited_client.wait(run_id, timeout=bound(60), history=False)
    assert snapshot.status == "completed", snapshot.final_reason
    assert snapshot.rate_limited_s >= pause * 0.5
    events = await limited_client.events(run_id)
    turns = [e.payload["detail"] for e in events if e.kind == "run.model_called"]
    assert turns[0]["rate_limit_wait_s"] >= pause * 0.5  # type: ignore[index,operator]
    shown = await lw(env, "events", run_id)
    assert "⏳ waiting for the rate limit" in shown and "paused by a 429" in shown, shown
    after = await lw(env, "status", run_id)
    assert "waiting on:" not in after and "rate limits: waited" in after, after
    # the fleet's view: the key's limits as learned from the stand-in's headers, and the tenant's wait
    view = await limited_client.fleet()
    [key] = [k for k in view.providers if k["provider"] == "anthropic"]
    assert key["dimensions"]["requests"]["source"] == "learned", key
    assert key["dimensions"]["requests"]["limit_per_minute"] == pytest.approx(20 * 60), key
    assert key["rejections"] >= 1, key
    [row] = [t for t in view.tenants if t.tenant == "default"]
    assert row.rate_limited_s > 0, row
    fleet = await lw(env, "fleet")
    assert f"anthropic key {key['account']}:" in fleet and "(learned)" in fleet, fleet


async def lw(env: dict[str, str], *args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "loopwarden.cli",
        *args,
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=bound(60))
    assert proc.returncode == 0, out.decode() + err.decode()
    return out.decode()


# --- the bound -------------------------------------------------------------------------------------------------


async def test_a_wait_past_the_runs_bound_ends_its_turn_with_a_typed_reason(
    limited: LocalStack, limited_client: Client, stand_in: FakeModel, learned: None
) -> None:
    armed = arm_429(stand_in, bound(5))
    [snapshot] = await submit_and_wait(limited_client, 1, RunLimits(max_rate_limit_wait_s=1.0))
    assert snapshot.status == "failed"
    reason = snapshot.final_reason or ""
    assert "for its rate limit (paused)" in reason and "past the bound of 1s" in reason, reason
    assert len(rejected_since(stand_in, armed)) == 1  # waited, not retried: one request for the run
    assert snapshot.awaiting is None  # no person is asked to wait for a rate limit


def test_the_dashboards_rate_limit_queries_name_what_the_planners_export(limited: LocalStack) -> None:
    # after the waits, pauses and the bound above: the figures the scrape test's scripted stack never makes
    # (its runs call no live provider; shared/metrics.py AWAITED)
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "loopwarden.json").read_text())
    queries = [t["expr"] for p in dashboard["panels"] if p["type"] != "row" for t in p["targets"]]
    used = {base_name(n) for q in queries for n in metric_names(q) if n.startswith("loopwarden_ratelimit_")}
    assert len(used) >= 4, used
    live: set[str] = set()
    for label, url in limited.metrics_urls().items():
        if label in PLANNERS:
            with urllib.request.urlopen(url, timeout=bound(5)) as resp:
                live |= set(re.findall(r"^# TYPE (\S+) ", resp.read().decode(), flags=re.M))
    assert used <= live, sorted(used - live)
    awaited = {M.prometheus_name(n, *M.CATALOGUE[n][:2]) for n in M.AWAITED}
    assert used <= awaited  # nothing else the dashboard reads may be absent from the scrape test's stack


# --- settings, through the gate ----------------------------------------------------------------------------------


@pytest.fixture
async def buses(limited: LocalStack) -> AsyncIterator[list[Bus]]:
    """Two "replicas": two connections, each its own limiter, sharing the fleet's records."""
    out = [Bus(Settings(nats_url=limited.nats_url), "planner") for _ in range(2)]
    for bus in out:
        await bus.connect()
    yield out
    for bus in out:
        await bus.stop()


def request(n: int) -> ModelRequest:
    return ModelRequest(purpose="plan", model="claude-haiku-4-5", system="s", messages=[ChatMessage.user(f"q{n}")])


async def test_a_setting_caps_a_learned_limit_across_replicas(buses: list[Bus]) -> None:
    api = FakeModel(rate_limit=RateLimit(requests_per_s=10, input_tokens_per_s=400_000)).start()  # says 600/min
    try:
        settings = Settings(rate_limits={"anthropic": {"requests": 120}})  # 2 a second
        limiters = [RateLimiter(bus, settings, get_meter("test")) for bus in buses]
        provider = AnthropicProvider("cap-key", api.base_url, 10, prompt_caching=False)
        first = limiters[0].gate(provider, purpose="plan", max_wait_s=60)
        await complete_with_retry(provider, request(0), POLICY, NoOpTracer(), gate=first)  # learns 600/min

        async def call(n: int) -> None:
            gate = limiters[n % 2].gate(provider, purpose="plan", max_wait_s=60)
            await complete_with_retry(provider, request(n), POLICY, NoOpTracer(), gate=gate)

        await asyncio.gather(*(call(n) for n in range(1, 6)))
        times = sorted(t for t, status in api.arrivals if status == 200)
        # 2 a second, not the 10 the stand-in allows: the 6 calls' slots span 2.5 s (0.5 s at 10 a second); no call
        # goes before its slot, the first may go up to 0.5 s after its own (a busy machine)
        assert len(times) == 6 and times[-1] - times[0] >= 2.0, [round(b - a, 2) for a, b in itertools.pairwise(times)]
        [key] = [k for k in await provider_keys(buses[0], settings) if k.account == provider.account]
        requests = key.dimensions["requests"]
        assert (requests.limit_per_minute, requests.source) == (120, "capped")
        assert key.dimensions["input_tokens"].source == "learned"
    finally:
        api.stop()


async def test_a_call_that_would_wait_past_its_bound_is_refused_and_reserves_nothing(buses: list[Bus]) -> None:
    api = FakeModel(rate_limit=RateLimit(requests_per_s=10, input_tokens_per_s=400_000)).start()
    try:
        settings = Settings(rate_limits={"anthropic": {"requests": 6}})  # one call every 10 s
        limiter = RateLimiter(buses[0], settings, get_meter("test"))
        provider = AnthropicProvider("bound-key", api.base_url, 10, prompt_caching=False)
        gate = limiter.gate(provider, purpose="plan", max_wait_s=1.0)
        await complete_with_retry(provider, request(0), POLICY, NoOpTracer(), gate=gate)
        started = time.monotonic()
        with pytest.raises(RateLimitWait) as refused:
            await complete_with_retry(
                provider, request(1), POLICY, NoOpTracer(), gate=limiter.gate(provider, purpose="plan", max_wait_s=1.0)
            )
        assert time.monotonic() - started < bound(1.0)  # refused at once, not after waiting
        assert not refused.value.transient and refused.value.kind == "rate_limit_wait"
        assert "past the bound of 1s" in str(refused.value)
        assert len(api.arrivals) == 1
        [key] = [k for k in await provider_keys(buses[0], settings) if k.account == provider.account]
        assert key.wait_s <= 10.0  # the refused call took no slot: the next one is the first's 10 s after
    finally:
        api.stop()


async def test_many_calls_from_two_replicas_stay_inside_a_limit_they_learned(buses: list[Bus]) -> None:
    """The benchmark's short form (``python -m bench --only ratelimit``): concurrent calls from two replicas
    against a stand-in enforcing 20 requests a second, with no setting."""
    api = FakeModel(rate_limit=RateLimit(requests_per_s=20, input_tokens_per_s=400_000)).start()
    try:
        limiters = [RateLimiter(bus, Settings(), get_meter("test")) for bus in buses]
        provider = AnthropicProvider("short-form-key", api.base_url, 10, prompt_caching=False)

        async def call(n: int) -> None:
            gate = limiters[n % 2].gate(provider, purpose="plan", max_wait_s=60)
            await complete_with_retry(provider, request(n), POLICY, NoOpTracer(), gate=gate)

        await asyncio.gather(*(call(n) for n in range(80)))
        rejected = sum(1 for _, status in api.arrivals if status == 429)
        answered = sorted(t for t, status in api.arrivals if status == 200)
        rate = (len(answered) - 2) / (answered[-1] - answered[1])  # after the first call (it learned the limit)
        assert len(answered) == 80 and rejected <= 0.02 * len(api.arrivals), (rejected, len(api.arrivals))
        assert rate >= 0.85 * 20, rate
    finally:
        api.stop()
