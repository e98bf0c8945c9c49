"""The metric names and their Prometheus forms, the label caps, the queue's figures, and the /metrics text
of one process: the SDK's Prometheus reader on a registry of the process's own."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from services.escalation import queue as Q
from shared import metrics as M
from shared.messages import Escalation
from shared.settings import Settings
from shared.telemetry import SCRAPE_MIN_INTERVAL_S, setup_telemetry


def families(text: str) -> dict[str, str]:
    """name -> TYPE of every family in a Prometheus text answer."""
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.M))


def test_every_catalogued_name_follows_the_scheme() -> None:
    for name in M.CATALOGUE:
        assert name.startswith(("loopwarden.", "gen_ai.client.")), name
        assert re.fullmatch(r"[a-z_]+(\.[a-z_]+)+", name), name
    assert M.AWAITED <= set(M.CATALOGUE)
    assert all(n.startswith(("loopwarden.flow.", "loopwarden.ratelimit.")) for n in M.AWAITED)


def test_every_instrument_is_named_by_a_catalogued_constant() -> None:
    """No metric name is a string literal at the instrument: each comes from shared/metrics.py, and is catalogued."""
    root = Path(__file__).resolve().parents[2]
    created = re.compile(
        r"(?:create_(?:counter|histogram|observable_gauge|gauge|up_down_counter)\(|Tally\(\s*\w+,)\s*([^,)\s]+)"
    )
    names = set()
    for path in [*root.glob("shared/**/*.py"), *root.glob("services/**/*.py"), *root.glob("loopwarden/**/*.py")]:
        for arg in created.findall(path.read_text()):
            assert not arg.startswith(('"', "'")), f"{path.relative_to(root)}: a literal metric name {arg}"
            names.add(arg)
    constants = {n for n in names if n.startswith("M.") or n.isupper()}
    assert len(constants) >= 20, sorted(names)  # the scan does find the instruments
    for constant in constants:
        assert getattr(M, constant.removeprefix("M.")) in M.CATALOGUE, constant


def test_prometheus_name_is_what_the_sdk_reader_exports() -> None:
    """Each catalogued instrument, recorded once through a real telemetry setup: the family names on /metrics
    are exactly ``prometheus_name`` of each (the docs, alerts and dashboard are written with these)."""
    telemetry = setup_telemetry("planner", Settings(), prometheus=True)
    meter = telemetry.meter("test")
    for name, (kind, unit, _) in M.CATALOGUE.items():
        if kind == "counter":
            meter.create_counter(name, unit=unit).add(1, {"tenant": "acme"})
        elif kind == "histogram":
            meter.create_histogram(name, unit=unit).record(1.5, {"tenant": "acme"})
        else:
            M.Gauges(meter, name, unit=unit).set({"tenant": "acme"}, 2.0)
    exported = families(telemetry.prometheus_text().decode())
    expected = {M.prometheus_name(n, k, u): k for n, (k, u, _) in M.CATALOGUE.items()}
    assert {n: t for n, t in exported.items() if n != "target_info"} == expected


def test_series_carry_the_service_name_and_no_scope_labels() -> None:
    telemetry = setup_telemetry("governor", Settings(), prometheus=True)
    telemetry.meter("x").create_counter(M.DEAD_LETTERS).add(1, {"subject": "lw.v1.cmd.judge.score"})
    text = telemetry.prometheus_text().decode()
    line = next(x for x in text.splitlines() if x.startswith("loopwarden_dead_letters_total{"))
    assert 'service_name="loopwarden-governor"' in line and "otel_scope" not in line, line


def test_a_scrape_storm_collects_once_a_second() -> None:
    telemetry = setup_telemetry("judge", Settings(), prometheus=True)
    calls = []
    M.computed_gauge(telemetry.meter("x"), M.SERVICE_READY, lambda: calls.append(1) or [({}, 1.0)])
    first = telemetry.prometheus_text()
    for _ in range(50):
        assert telemetry.prometheus_text() == first
    assert len(calls) == 1
    telemetry._scraped = (telemetry._scraped[0] - SCRAPE_MIN_INTERVAL_S, first)  # a second later
    telemetry.prometheus_text()
    assert len(calls) == 2


def test_no_prometheus_reader_without_a_health_port() -> None:
    assert setup_telemetry("planner", Settings()).registry is None
    assert setup_telemetry("planner", Settings(health_port=0)).registry is not None


def test_a_label_keeps_at_most_its_cap_of_values() -> None:
    tenants = M.Bounded(limit=3)
    assert [tenants(t) for t in ("a", "b", "a", "c", "d", "e", "b", None)] == [
        "a",
        "b",
        "a",
        "c",
        M.OTHER,
        M.OTHER,
        "b",
        M.OTHER,  # no value is a value too, and the cap is reached
    ]
    assert M.Bounded()("x" * 500) == "x" * M.MAX_LABEL_LENGTH
    assert M.Bounded()(None) == M.NONE


def test_redeliveries_and_dead_letters_are_counted_by_subject_stem_never_by_run() -> None:
    telemetry = setup_telemetry("planner", Settings(), prometheus=True)
    bus = M.BusMetrics(telemetry.meter("loopwarden.bus"))
    for run in ("run-1", "run-2", "run-3"):
        bus.redelivered("planner_outcomes", f"lw.v1.evt.tool.succeeded.calc.{run}")
        bus.dead_lettered(f"lw.v1.evt.failure.fatal.calc.{run}")
    text = telemetry.prometheus_text().decode()
    assert "run-" not in text
    assert (
        'loopwarden_bus_redeliveries_total{durable="planner_outcomes",service_name="loopwarden-planner",'
        'subject="lw.v1.evt.tool.succeeded.calc"} 3.0' in text
    )
    assert (
        'loopwarden_dead_letters_total{service_name="loopwarden-planner",subject="lw.v1.evt.failure.fatal.calc"} 3.0'
        in text
    )


def test_run_metrics_bound_tenants_and_agents() -> None:
    telemetry = setup_telemetry("planner", Settings(), prometheus=True)
    runs = M.RunMetrics(telemetry.meter("loopwarden.planner"))
    for i in range(M.MAX_LABEL_VALUES + 20):
        runs.started(f"tenant-{i}", None)
    runs.finished("completed", "tenant-0", "calc", seconds=3.0, cost_usd=0.25, input_tokens=10, output_tokens=2)
    text = telemetry.prometheus_text().decode()
    started = [x for x in text.splitlines() if x.startswith("loopwarden_runs_started_total{")]
    assert len(started) == M.MAX_LABEL_VALUES + 1  # the cap, and one row for every tenant past it
    assert any('tenant="_other"' in x and x.endswith(" 20.0") for x in started)
    assert (
        'loopwarden_runs_cost_USD_total{agent="calc",service_name="loopwarden-planner",tenant="tenant-0"} 0.25' in text
    )
    assert 'gen_ai_token_type="output"' in text


def item(kind: str, status: str, age_s: float, now: datetime, sla_in_s: float | None = None) -> Escalation:
    return Escalation.model_validate(
        {
            "escalation_id": f"{kind}-{status}-{age_s}",
            "run_id": "r",
            "kind": kind,
            "reason": "x",
            "status": status,
            "created_at": now - timedelta(seconds=age_s),
            "sla_deadline": None if sla_in_s is None else now + timedelta(seconds=sla_in_s),
            "sla_action": None if sla_in_s is None else "abort",
        }
    )


def test_queue_figures_count_unresolved_items_their_oldest_and_those_past_sla() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    items = [
        item("approval", "open", 30, now),
        item("approval", "open", 600, now, sla_in_s=-5),  # past its SLA, not swept yet
        item("approval", "claimed", 100, now, sla_in_s=60),
        item("fatal", "resolved", 9000, now),
    ]
    f = Q.figures(items, now)
    assert f.items[("approval", "open")] == 2 and f.items[("approval", "claimed")] == 1
    assert f.items[("fatal", "open")] == 0 and f.oldest_age_s["fatal"] == 0.0  # resolved: not counted
    assert f.oldest_age_s["approval"] == pytest.approx(600)
    assert f.past_sla == {**dict.fromkeys(f.past_sla, 0), "approval": 1}
