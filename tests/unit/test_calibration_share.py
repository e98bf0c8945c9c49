"""What the governor does beside the step's path, not on it: it merges its calibration into the
shared ratios after answering (the merge itself is pure)."""

from __future__ import annotations

from services.governor.handlers import Calibration, share


def test_replicas_ratios_are_merged_by_sample_count() -> None:
    stored = Calibration(ratios={"m": 1.0, "other": 2.0}, samples={"m": 30, "other": 4})
    mine = Calibration(ratios={"m": 1.6}, samples={"m": 10})
    merged, _ = share(mine, stored)
    assert merged.ratios == {"m": 1.15, "other": 2.0}  # (1.0 * 30 + 1.6 * 10) / 40
    assert merged.samples == {"m": 30, "other": 4}


def test_the_first_ratios_shared_are_taken_as_they_are() -> None:
    merged, _ = share(Calibration(ratios={"m": 1.3}, samples={"m": 1}), None)
    assert merged.ratios == {"m": 1.3} and merged.samples == {"m": 1}
