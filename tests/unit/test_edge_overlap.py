"""What the executor and the governor do beside the step's path, not on it: the executor's attempt
event travels while the final is recorded (and still fails the delivery when it fails); the governor
merges its calibration into the shared ratios after answering (the merge itself is pure)."""

from __future__ import annotations

import asyncio

import pytest

from services.executor.handlers import alongside
from services.governor.handlers import Calibration, share


class Refused(Exception):
    pass


async def sent(log: list[str], name: str, fail: bool = False) -> None:
    await asyncio.sleep(0.01)
    log.append(name)
    if fail:
        raise Refused(name)


async def test_the_side_publish_runs_beside_the_main_work_and_both_finish() -> None:
    log: list[str] = []
    side = asyncio.create_task(sent(log, "attempt event"))
    await alongside(side, sent(log, "final recorded"))
    assert side.done() and sorted(log) == ["attempt event", "final recorded"]


async def test_a_failed_side_publish_fails_the_delivery_so_it_is_redelivered() -> None:
    log: list[str] = []
    side = asyncio.create_task(sent(log, "attempt event", fail=True))
    with pytest.raises(Refused, match="attempt event"):
        await alongside(side, sent(log, "final recorded"))
    assert log == ["attempt event", "final recorded"] or log == ["final recorded", "attempt event"]


async def test_when_both_fail_the_main_failure_is_raised_and_the_side_is_settled() -> None:
    side = asyncio.create_task(sent([], "attempt event", fail=True))
    with pytest.raises(Refused, match="final recorded"):
        await alongside(side, sent([], "final recorded", fail=True))
    assert side.done() and isinstance(side.exception(), Refused)


def test_replicas_ratios_are_merged_by_sample_count() -> None:
    stored = Calibration(ratios={"m": 1.0, "other": 2.0}, samples={"m": 30, "other": 4})
    mine = Calibration(ratios={"m": 1.6}, samples={"m": 10})
    merged, _ = share(mine, stored)
    assert merged.ratios == {"m": 1.15, "other": 2.0}  # (1.0 * 30 + 1.6 * 10) / 40
    assert merged.samples == {"m": 30, "other": 4}


def test_the_first_ratios_shared_are_taken_as_they_are() -> None:
    merged, _ = share(Calibration(ratios={"m": 1.3}, samples={"m": 1}), None)
    assert merged.ratios == {"m": 1.3} and merged.samples == {"m": 1}
