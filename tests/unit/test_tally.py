"""A ``Tally`` (``shared/metrics.py``): a counter summed in the process and read at collection. On /metrics it is
what the SDK's counter of the same name, unit and adds exports: the same family, type and series."""

from __future__ import annotations

import re

from shared import metrics as M
from shared.settings import Settings
from shared.telemetry import setup_telemetry

ADDS: list[tuple[float, dict[str, str | int] | None]] = [
    (1, {"action": "complete", "row": 1}),
    (2, {"row": 1, "action": "complete"}),  # the same label set, in another order
    (0.25, {"action": "retry", "row": 3}),
    (-5, {"action": "retry", "row": 3}),  # a counter only grows: dropped, as the SDK drops it
    (1, None),
]


def scrape(make: str) -> str:
    telemetry = setup_telemetry("planner", Settings(), prometheus=True)
    meter = telemetry.meter("test")
    if make == "sdk":
        counter = meter.create_counter(M.MODEL_COST, unit="USD", description="billed model cost")
        for amount, attrs in ADDS:
            if amount >= 0:  # the SDK warns on a negative add before it drops it
                counter.add(amount, attrs)
    else:
        tally = M.Tally(meter, M.MODEL_COST, unit="USD", description="billed model cost")
        for amount, attrs in ADDS:
            tally.add(amount, attrs)
    text = telemetry.prometheus_text().decode()
    return "\n".join(line for line in text.splitlines() if "model_cost" in line and "created" not in line)


def test_a_tally_exports_what_the_sdk_counter_does() -> None:
    sdk, tally = scrape("sdk"), scrape("tally")
    assert re.search(r"^# TYPE loopwarden_model_cost_USD_total counter$", tally, flags=re.M), tally
    assert sorted(tally.splitlines()) == sorted(sdk.splitlines())
    assert 'loopwarden_model_cost_USD_total{action="complete",row="1",service_name="loopwarden-planner"} 3.0' in tally


def test_a_tally_counts_label_sets_past_its_cap_in_the_overflow_set() -> None:
    telemetry = setup_telemetry("planner", Settings(), prometheus=True)
    tally = M.Tally(telemetry.meter("test"), M.TOOL_ATTEMPTS)
    tally.MAX_ROWS = 3
    for tool in ("a", "b", "c", "d", "e", "a"):
        tally.add(1, {"tool": tool})
    assert tally.values == {
        (("tool", "a"),): 2,
        (("tool", "b"),): 1,
        (("tool", "c"),): 1,
        M.Tally.OVERFLOW: 2,
    }
