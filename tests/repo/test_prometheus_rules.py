"""The alert rules (deploy/prometheus/alerts.yml) with Debian's promtool: they load, their tests pass, a
rule that no longer fires fails its test, every alert is tested and has a runbook line in
docs/observability.md, and every metric a rule reads is one the services export (shared/metrics.py)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from shared import metrics as M
from tests.support.paths import ROOT
from tests.support.promql import base_name, metric_names
from tests.support.timing import bound

RULES_DIR = ROOT / "deploy" / "prometheus"
DOC = ROOT / "docs" / "observability.md"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"  # `make test` installs Debian's prometheus package


def promtool(*args: str, cwd: Path = RULES_DIR) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=bound(60))


def rules() -> list[dict[str, Any]]:
    data = yaml.safe_load((RULES_DIR / "alerts.yml").read_text())
    return [r for g in data["groups"] for r in g["rules"]]


def alerts() -> list[dict[str, Any]]:
    return [r for r in rules() if "alert" in r]


def test_the_rules_load_and_their_tests_pass() -> None:
    checked = promtool("check", "rules", "alerts.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", "alerts_test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_a_rule_that_no_longer_fires_fails_its_test(tmp_path: Path) -> None:
    for name in ("alerts.yml", "alerts_test.yml"):
        shutil.copy(RULES_DIR / name, tmp_path / name)
    text = (tmp_path / "alerts.yml").read_text()
    broken = text.replace("loopwarden_dead_letters_total", "loopwarden_dead_letter_total")  # a misnamed metric
    assert broken != text
    (tmp_path / "alerts.yml").write_text(broken)
    tested = promtool("test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert tested.returncode != 0
    assert "LoopwardenDeadLetters" in tested.stdout + tested.stderr


def test_every_alert_is_tested_has_a_runbook_line_and_reads_exported_metrics() -> None:
    tests = yaml.safe_load((RULES_DIR / "alerts_test.yml").read_text())["tests"]
    fired = {c["alertname"] for t in tests for c in t["alert_rule_test"] if c["exp_alerts"]}
    doc = DOC.read_text()
    exported = set(M.exposition_names())
    recorded = {r["record"] for r in rules() if "record" in r}
    for rule in alerts():
        name = rule["alert"]
        assert name in fired, f"{name} has no test where it fires"
        anchor = rule["annotations"]["runbook"].split("#", 1)[1]
        assert anchor == name.lower()
        assert re.search(rf"^#+ {name}$", doc, flags=re.M), f"docs/observability.md has no runbook for {name}"
    for rule in rules():
        for metric in metric_names(rule["expr"]):
            assert metric in exported or base_name(metric) in exported, (rule.get("alert"), metric)
        assert set(re.findall(r"\bloopwarden:[a-z0-9:_]+", rule["expr"])) <= recorded, rule
