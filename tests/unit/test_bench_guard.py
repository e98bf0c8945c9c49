"""The regression guard reads the last release's figures from docs/benchmarks.md and marks what got worse."""

from __future__ import annotations

from bench import guard

DOC = """
Some text.

```bench-release 9.9.0
# ratios to the in-process floor
step_1run_10 2.00
round_trips 12   # a count
```
"""


def test_the_recorded_release_is_read_from_its_fenced_block() -> None:
    assert guard.recorded(DOC) == ("9.9.0", {"step_1run_10": 2.0, "round_trips": 12.0})


def test_a_figure_worse_by_more_than_15_percent_is_marked_and_a_better_one_is_not() -> None:
    lines = guard.report({"step_1run_10": 2.4, "round_trips": 11.0, "stored_bytes": 30_000.0}, DOC)
    text = "\n".join(lines)
    step = next(line for line in lines if line.strip().startswith("a step, 1 run of 10"))
    trips = next(line for line in lines if line.strip().startswith("round trips"))
    assert step.endswith("WORSE") and "+20%" in step
    assert not trips.endswith("WORSE") and "-8%" in trips
    assert "1 figure(s) worse by more than 15%" in text
    assert any(line.strip().startswith("bytes stored") and " - " in line for line in lines)  # not recorded


def test_the_docs_record_a_release_for_every_headline_figure() -> None:
    release, figures = guard.recorded()
    assert release and set(figures) == set(guard.HEADLINES), sorted(set(guard.HEADLINES) ^ set(figures))
