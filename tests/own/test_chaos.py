"""Chaos, short form: concurrent runs (one in three moves money with a non-idempotent tool)
while random replicas of every service are SIGKILLed and restarted.

Nothing is lost, nothing is charged twice, and a run that cannot finish is waiting for a
human with its escalation in the queue. The long form (80 runs, 30 kills) is
``python -m bench --only chaos``. A doubled charge here would be the executor's ledger window
(issue 9 item 1: a crash between a non-idempotent side effect and its final record): the
assertion stays, it is the requirement.
"""

from __future__ import annotations

from pathlib import Path

from bench.chaos import REPLICAS, report, run_chaos
from tests.support.timing import bound


def test_random_replicas_killed_under_load_lose_and_double_nothing(tmp_path: Path) -> None:
    result = run_chaos(runs=12, kills=8, interval=0.8, seed=11, timeout=bound(60), state_dir=tmp_path)
    summary = "\n".join(report(result))
    print(summary)
    assert set(result.kills) == set(REPLICAS), summary  # every service lost a replica at least once
    assert result.lost == [], summary
    assert result.doubled == {}, summary
    assert result.stuck == {}, summary
    assert result.dead_letters == [], summary
    assert result.completed + result.escalated == result.runs, summary
    # A killed replica's replacement appends to its log: what the dead process wrote is still there.
    restarted = [log for log in (tmp_path / "logs").glob("*.log") if log.read_text().count("--- started") > 1]
    assert restarted, summary
    assert all("ready" in log.read_text().split("--- started")[1] for log in restarted)
