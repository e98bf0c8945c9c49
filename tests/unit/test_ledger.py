"""The idempotency ledger as a table: what a (re)delivered tool command may do."""

from __future__ import annotations

import pytest

from services.executor.ledger import DeliveryAction, FinalPublish, LedgerEntry, claim, on_delivery

FINAL = FinalPublish(subject="s", msg_id="m", payload="{}")


@pytest.mark.parametrize(
    ("entry", "verdict"),
    [
        (None, "run"),  # never seen: run it
        # created before the tool ran, nothing recorded after: the effect is unknown
        (LedgerEntry(attempt_id="a", tool="charge_card", idempotent=False), "unknown_outcome"),
        (LedgerEntry(attempt_id="a", tool="charge_card", idempotent=False, runs=3), "unknown_outcome"),
        (LedgerEntry(attempt_id="a", tool="search", idempotent=True), "run"),  # safe to run again
        # the final message is recorded: publish it again, whatever the tool
        (LedgerEntry(attempt_id="a", tool="charge_card", idempotent=False, final=FINAL), "republish"),
        (LedgerEntry(attempt_id="a", tool="search", idempotent=True, final=FINAL), "republish"),
    ],
)
def test_a_redelivery_runs_a_tool_again_only_when_that_is_safe(
    entry: LedgerEntry | None, verdict: DeliveryAction
) -> None:
    assert on_delivery(entry) == verdict


def test_a_non_idempotent_call_is_never_run_by_a_second_delivery() -> None:
    first = claim(None, "a", "charge_card", idempotent=False)
    assert first.runs == 1 and first.final is None
    assert on_delivery(first) == "unknown_outcome"  # whatever point the first delivery died at


def test_claiming_again_counts_the_runs_of_an_idempotent_call() -> None:
    first = claim(None, "a", "search", idempotent=True)
    again = claim(first, "a", "search", idempotent=True)
    assert again.runs == 2 and first.runs == 1


def test_an_entry_first_created_by_a_redelivery_counts_the_unclaimed_runs_before_it() -> None:
    # an idempotent call's first delivery runs without a claim; the third delivery creates the entry
    assert claim(None, "a", "search", idempotent=True, delivery=3).runs == 3
    assert claim(None, "a", "search", idempotent=True).runs == 1
