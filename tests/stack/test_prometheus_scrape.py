"""A real Prometheus (Debian's package) scrapes a real stack: every service's ``/metrics`` on its health
port, with the alert rules loaded. A few runs go through (two tenants of their own; one corrects its
arguments), a malformed submit is dead-lettered, an advance of a run that does not exist is redelivered,
and the figures come back through Prometheus's HTTP API: runs by status and tenant, backlog per durable,
tool attempts and latency, model latency, the queue, each tenant's day against its ceiling, the store,
and the dead-letter alert firing. The dashboard's queries (deploy/grafana/loopwarden.json) name only
metrics the live ``/metrics`` shows, and each one runs.

It reuses the session's stack (its counters hold what earlier tests did: the figures are read as what
grew since Prometheus's first scrape) and starts one Prometheus for the module, scraping and evaluating
the rules every second. The console's ``/metrics``: tests/locked/test_console_security.py.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import yaml

from loopwarden.client import Client
from loopwarden.stack import LocalStack, free_port, tail
from shared import metrics as M
from shared import subjects as S
from shared.messages import RunAdvance
from shared.scenario import parse_scenario
from shared.version import package_version
from tests.support.paths import ROOT
from tests.support.promql import base_name, metric_names
from tests.support.stacks import REPLICAS, TEST_ENV, settings_for
from tests.support.timing import bound, eventually, eventually_sync

PROMETHEUS = "/usr/bin/prometheus"  # `make test` installs Debian's prometheus package
DASHBOARD = ROOT / "deploy" / "grafana" / "loopwarden.json"
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
DEMO = yaml.safe_load((ROOT / "scenarios" / "demo.yaml").read_text())
CORRECTED = yaml.safe_load((ROOT / "scenarios" / "bad-arguments-corrected.yaml").read_text())
RUN_ID = uuid.uuid4().hex[:8]
TENANT, OTHER = f"obs{RUN_ID}", f"obs{RUN_ID}b"  # tenants of this module's runs only


def scrape_config(stack: LocalStack) -> dict[str, Any]:
    """A job per service (``loopwarden-<service>``, its replicas its targets): /metrics every second; the
    rules evaluated every second."""
    every = f"{round(bound(1) * 1000)}ms"  # a second on an idle machine
    jobs: dict[str, list[str]] = {}
    for label, url in stack.metrics_urls().items():
        jobs.setdefault(f"loopwarden-{label.split('#')[0]}", []).append(urllib.parse.urlsplit(url).netloc)
    return {
        "global": {"scrape_interval": every, "scrape_timeout": every, "evaluation_interval": every},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {"job_name": job, "metrics_path": "/metrics", "static_configs": [{"targets": targets}]}
            for job, targets in jobs.items()
        ],
    }


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's result vector, now or ``at`` (an error answer fails the test, naming the query)."""
        params = {"query": promql, **({"time": f"{at:.3f}"} if at is not None else {})}
        try:
            with urllib.request.urlopen(
                f"{self.url}/api/v1/query?{urllib.parse.urlencode(params)}", timeout=bound(10)
            ) as resp:
                answer = json.loads(resp.read())
        except urllib.error.HTTPError as err:
            raise AssertionError(f"{promql}: {err.read().decode(errors='replace')}") from None
        assert answer["status"] == "success", (promql, answer)
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def time(self) -> float:
        """Prometheus's clock now."""
        with urllib.request.urlopen(f"{self.url}/api/v1/query?query=time()", timeout=bound(10)) as resp:
            return float(json.loads(resp.read())["data"]["result"][1])

    def value(self, promql: str, at: float | None = None) -> float | None:
        result = self.query(promql, at)
        return float(result[0]["value"][1]) if result else None


@pytest.fixture(scope="module")
def prometheus(stack: LocalStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    home = tmp_path_factory.mktemp("prometheus")
    (home / "prometheus.yml").write_text(yaml.safe_dump(scrape_config(stack)))
    port = free_port()
    log = home / "prometheus.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={home / 'prometheus.yml'}",
                f"--storage.tsdb.path={home / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert proc.poll() is None, f"prometheus exited:\n{tail(log)}"
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=bound(1)) as resp:
                return resp.status == 200
        except OSError:
            return False

    try:
        eventually_sync(ready, what="prometheus ready", within=bound(30), every=0.1)
        yield Prometheus(url)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=bound(10))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Baseline:
    """What the counters held at Prometheus's first scrape of every target: a figure is what grew since."""

    def __init__(self, prometheus: Prometheus) -> None:
        self.p, self.at = prometheus, prometheus.time()

    def grew(self, promql: str) -> float:
        before = self.p.value(promql, at=self.at) or 0.0
        return (self.p.value(promql) or 0.0) - before


@pytest.fixture(scope="module")
async def baseline(stack: LocalStack, prometheus: Prometheus) -> Baseline:
    targets = len(stack.metrics_urls())
    await eventually(
        lambda: prometheus.value("count(loopwarden_service_ready)") == targets,
        what=f"a first scrape of all {targets} targets",
        within=bound(30),
        every=0.2,
    )
    return Baseline(prometheus)


@pytest.fixture(scope="module")
async def after_runs(stack: LocalStack, baseline: Baseline) -> AsyncIterator[LocalStack]:
    """Two demo runs of one tenant and one run of another that corrects its arguments, each to its end; a
    malformed submit (dead-lettered at once); an advance of a run nobody stored (held, handed back, redelivered)."""
    async with Client(settings_for(stack, tenant=TENANT)) as client:
        runs = [await client.submit_scenario(parse_scenario(DEMO)) for _ in range(2)]
        for run in runs:
            assert (await client.wait(run, timeout=bound(60))).status == "completed"
        await client.bus.publish(S.run_submit(), b"{not json", msg_id=f"obs-malformed-{RUN_ID}")
        advance = RunAdvance(run_id=f"obs-no-such-run-{RUN_ID}", iteration=1)
        await client.bus.publish(S.RUN_ADVANCE, advance, msg_id=f"obs-advance-{RUN_ID}")
    async with Client(settings_for(stack, tenant=OTHER)) as other:
        run = await other.submit_scenario(parse_scenario(CORRECTED))
        assert (await other.wait(run, timeout=bound(60))).status == "completed"
    yield stack


def live_names(stack: LocalStack) -> set[str]:
    """Every family name the processes' /metrics show now (histograms by their base name)."""
    names: set[str] = set()
    for url in stack.metrics_urls().values():
        with urllib.request.urlopen(url, timeout=bound(5)) as resp:
            assert resp.headers["content-type"].startswith("text/plain; version=0.0.4"), url
            names |= set(re.findall(r"^# TYPE (\S+) ", resp.read().decode(), flags=re.M))
    return names


async def test_prometheus_scrapes_every_process_and_reads_the_fleet_back(
    after_runs: LocalStack, prometheus: Prometheus, baseline: Baseline
) -> None:
    p, grew = prometheus, baseline.grew
    targets = len(after_runs.metrics_urls())  # the stack's replicas, and any a test before this one added
    assert targets >= len(REPLICAS)

    async def scraped_after_the_runs() -> bool:
        done = p.value(f'sum(loopwarden_runs_finished_total{{tenant=~"{TENANT}|{OTHER}"}})') or 0
        letters = grew('sum(loopwarden_dead_letters_total{subject="lw.v1.cmd.run.submit.default"})')
        spent = p.value(f'max(loopwarden_tenant_spent_today_USD{{tenant="{OTHER}"}})') or 0
        return done >= 3 and letters >= 1 and spent > 0

    await eventually(scraped_after_the_runs, what="the runs' figures in Prometheus", within=bound(30), every=0.5)
    assert p.value('count(up{job=~"loopwarden-.*"} == 1)') == targets
    ready = p.query("loopwarden_service_ready == 1")
    assert len(ready) == targets and {r["metric"]["service_name"] for r in ready} == {
        f"loopwarden-{s}" for s in REPLICAS
    }
    runs = f'tenant=~"{TENANT}|{OTHER}"'
    ceiling = float(TEST_ENV["LW_TENANT_DAILY_CEILING_USD"])
    # each figure as it should read once every target's next scrape (and the next JetStream poll) is in
    expected: dict[str, Callable[[], bool]] = {
        # runs by status, tenant and agent; what they spent and how long they took
        "runs finished by tenant": lambda: (
            {
                r["metric"]["tenant"]: float(r["value"][1])
                for r in p.query(f"sum by (tenant) (loopwarden_runs_finished_total{{{runs}}})")
            }
            == {TENANT: 2.0, OTHER: 1.0}
        ),
        "runs started": lambda: p.value(f"sum(loopwarden_runs_started_total{{{runs}}})") == 3,
        "by status and agent": lambda: (
            p.value(f'sum(loopwarden_runs_finished_total{{tenant="{OTHER}", status="completed", agent="_none"}})') == 1
        ),
        "run cost": lambda: (p.value(f'sum(loopwarden_runs_cost_USD_total{{tenant="{OTHER}"}})') or 0) > 0,
        "run durations": lambda: p.value(f"sum(loopwarden_run_duration_seconds_count{{{runs}}})") == 3,
        # backlog and pending acks of every service's durables, from JetStream
        "durables": lambda: (
            {r["metric"]["durable"] for r in p.query("loopwarden_consumer_ack_pending")}
            >= {"planner_submit", "planner_outcomes", "validator", "judge", "executor_search", "requeue_planner"}
        ),
        "backlog": lambda: p.value('max(loopwarden_consumer_pending{durable="validator"})') == 0,
        # tools: attempts (the demo's search fails once, transiently), latency, repairs, corrected arguments
        "transient": lambda: grew('sum(loopwarden_tool_attempts_total{tool="search", result="transient"})') == 2,
        "tool latency": lambda: grew('sum(loopwarden_tool_duration_seconds_count{tool="calculator"})') == 3,
        "repairs": lambda: grew('sum(loopwarden_tool_outputs_total{tool="search", result="repaired"})') == 2,
        "failures": lambda: (
            grew('sum(loopwarden_failures_total{failure_type="input_invalid", tool="exchange_rate"})') == 1
        ),
        "corrections": lambda: (
            grew('sum(loopwarden_tool_corrections_total{tool="exchange_rate", outcome="recovered"})') == 1
        ),
        # models: three turns per demo run and four of the corrected run, input and output tokens each
        "model calls": lambda: (
            grew('sum(gen_ai_client_operation_duration_seconds_count{service_name="loopwarden-planner"})') == 10
        ),
        "tokens": lambda: grew('sum(gen_ai_client_token_usage_count{service_name="loopwarden-planner"})') == 20,
        "judge calls": lambda: (
            grew('sum(gen_ai_client_operation_duration_seconds_count{service_name="loopwarden-judge"})') >= 2
        ),
        # the human queue, each tenant's day against its ceiling, the store
        "queue": lambda: (
            {r["metric"]["kind"] for r in p.query("loopwarden_queue_items")} >= {"approval", "fatal", "not_judged"}
        ),
        "ceiling": lambda: p.value(f'max(loopwarden_tenant_daily_ceiling_USD{{tenant="{OTHER}"}})') == ceiling,
        "default ceiling": lambda: p.value('max(loopwarden_tenant_daily_ceiling_USD{tenant="default"})') == 1000,
        "spent": lambda: 0 < (p.value(f'max(loopwarden_tenant_spent_today_USD{{tenant="{OTHER}"}})') or 0) < ceiling,
        "store": lambda: (p.value('max(loopwarden_store_bytes{stream="LW_EVT"})') or 0) > 0,
        "dead letters stored": lambda: (p.value('max(loopwarden_store_messages{stream="LW_DLQ"})') or 0) >= 1,
    }

    def wrong() -> list[str]:
        return [name for name, holds in expected.items() if not holds()]

    with contextlib.suppress(AssertionError):
        await eventually(lambda: not wrong(), what="every figure", within=bound(20), every=0.5)
    assert not wrong(), wrong()

    # the rules run on the real figures: the dead letter fires its alert (other letters of the stack may fire
    # theirs first: it is this one's that is waited for)
    fired: set[tuple[str, str]] = set()

    async def firing() -> bool:
        nonlocal fired
        alerts = p.query('ALERTS{alertname="LoopwardenDeadLetters", alertstate="firing"}')
        fired = {(a["metric"]["service_name"], a["metric"]["subject"]) for a in alerts}
        return ("loopwarden-planner", "lw.v1.cmd.run.submit.default") in fired

    with contextlib.suppress(AssertionError):
        await eventually(firing, what="LoopwardenDeadLetters firing", within=bound(30), every=0.5)
    assert ("loopwarden-planner", "lw.v1.cmd.run.submit.default") in fired, fired
    assert not p.query('ALERTS{alertname=~"LoopwardenServiceNotReady|LoopwardenScrapeDown"}')


def dashboard_queries() -> list[str]:
    data = json.loads(DASHBOARD.read_text())
    panels = [p for p in data["panels"] if p["type"] != "row"]
    return [t["expr"] for p in panels for t in p["targets"]]


async def test_every_dashboard_query_names_a_live_metric_and_runs(
    after_runs: LocalStack, prometheus: Prometheus
) -> None:
    queries = dashboard_queries()
    assert len(queries) > 30
    used = {base_name(name) for q in queries for name in metric_names(q)}
    awaited = {M.prometheus_name(n, *M.CATALOGUE[n][:2]) for n in M.AWAITED}  # a live provider's: test_rate_limits
    live: set[str] = set()

    def all_live() -> set[str]:
        nonlocal live
        live = live_names(after_runs)
        return set() if used - live - awaited else live

    with contextlib.suppress(AssertionError):  # the advance nobody takes is redelivered after the ack wait
        await eventually(all_live, what="every dashboard metric on /metrics", within=bound(20), every=0.5)
    missing = used - live - awaited
    assert not missing, f"the dashboard reads metrics no process exports: {sorted(missing)}"
    assert used & live and len(used & live) >= 25, sorted(used & live)
    # and every query parses and runs (Grafana's variables given values)
    for q in queries:
        concrete = q.replace("$__rate_interval", "5m").replace("$tenant", "acme").replace("$tool", "search")
        prometheus.query(concrete)
    tool_row = 'sum by (result) (increase(loopwarden_tool_attempts_total{tool="search"}[5m]))'
    assert prometheus.query(tool_row), prometheus.query('loopwarden_tool_attempts_total{tool="search"}[5m]')
    versions = prometheus.query(
        'count by (service_name, service_version) (target_info{service_namespace="loopwarden"})'
    )
    assert {r["metric"]["service_version"] for r in versions} == {package_version()}
