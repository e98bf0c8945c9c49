"""The idempotency ledger as a table: what a (re)delivered tool command may do."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from services.executor.ledger import (
    ConflictAction,
    DeliveryAction,
    FinalPublish,
    LedgerEntry,
    claim,
    on_delivery,
    on_final_conflict,
    renewed,
)

FINAL = FinalPublish(subject="s", msg_id="m", payload="{}")
UNKNOWN = FinalPublish(subject="f", msg_id="a.failed.unknown_outcome", payload="{}", unknown_outcome=True)
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
LEASE_S = 10.0
LIVE = NOW + timedelta(seconds=4)
LAPSED = NOW - timedelta(seconds=1)


def decide(entry: LedgerEntry | None, unchanged_s: float = LEASE_S) -> DeliveryAction:
    """A delivery that has seen the entry unchanged for a whole lease (unless said otherwise)."""
    return on_delivery(entry, NOW, unchanged_s, LEASE_S)


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
    assert decide(entry) == verdict


def test_a_non_idempotent_call_is_never_run_by_a_second_delivery() -> None:
    first = claim(None, "a", "charge_card", idempotent=False)
    assert first.runs == 1 and first.final is None
    assert decide(first) == "unknown_outcome"  # whatever point the first delivery died at


def test_claiming_again_counts_the_runs_of_an_idempotent_call() -> None:
    first = claim(None, "a", "search", idempotent=True)
    again = claim(first, "a", "search", idempotent=True)
    assert again.runs == 2 and first.runs == 1


def test_an_entry_first_created_by_a_redelivery_counts_the_unclaimed_runs_before_it() -> None:
    # an idempotent call's first delivery runs without a claim; the third delivery creates the entry
    assert claim(None, "a", "search", idempotent=True, delivery=3).runs == 3
    assert claim(None, "a", "search", idempotent=True).runs == 1


# --- whose call it is: the owner's lease (issue 28, edge 1) ----------------------------------------


def owned(idempotent: bool = False, lease_until: datetime | None = LIVE, **kw: object) -> LedgerEntry:
    return LedgerEntry.model_validate(
        {"attempt_id": "a", "tool": "t", "idempotent": idempotent, "owner": "A", "lease_until": lease_until, **kw}
    )


@pytest.mark.parametrize(
    ("entry", "unchanged_s", "verdict"),
    [
        # the owner's lease is live: it is running the call, whatever this replica has seen
        (owned(), LEASE_S * 10, "wait"),
        (owned(idempotent=True), LEASE_S * 10, "wait"),  # not run twice side by side either
        # lapsed, but not seen unchanged for a whole lease here: the owner may be cut off by an outage
        (owned(lease_until=LAPSED), 0.0, "wait"),
        (owned(lease_until=LAPSED), LEASE_S - 0.1, "wait"),
        # lapsed and silent for a whole lease, seen from here: the owner is gone
        (owned(lease_until=LAPSED), LEASE_S, "unknown_outcome"),
        (owned(idempotent=True, lease_until=LAPSED), 0.0, "run"),  # running it again is harmless
        # an entry written before leases (no owner): the same whole lease of silence first
        (owned(lease_until=None, owner=None), 1.0, "wait"),
        (owned(lease_until=None, owner=None), LEASE_S, "unknown_outcome"),
        # a final recorded: republished, leases do not matter
        (owned(final=FINAL), 0.0, "republish"),
    ],
)
def test_a_call_is_declared_unknown_only_after_its_owner_let_a_whole_lease_pass_unrenewed(
    entry: LedgerEntry, unchanged_s: float, verdict: DeliveryAction
) -> None:
    assert decide(entry, unchanged_s) == verdict


def test_a_claim_names_its_owner_and_a_renewal_moves_only_the_lease_on() -> None:
    first = claim(None, "a", "charge_card", idempotent=False, owner="A", lease_until=LIVE)
    assert (first.owner, first.lease_until) == ("A", LIVE)
    again = claim(first, "a", "charge_card", idempotent=False, owner="B", lease_until=LIVE)
    assert again.owner == "B" and again.runs == 2
    later = renewed(first, NOW + timedelta(seconds=30), LEASE_S)
    assert later.lease_until == NOW + timedelta(seconds=30 + LEASE_S)
    assert later.model_copy(update={"lease_until": first.lease_until}) == first


@pytest.mark.parametrize(
    ("stored", "ours", "action"),
    [
        (None, FINAL, "retry_delivery"),  # gone: the delivery is retried
        (owned(), FINAL, "rewrite"),  # only this owner's renewals moved it on
        (owned(owner="B"), FINAL, "retry_delivery"),  # another replica claimed it since
        (owned(final=UNKNOWN), FINAL, "replace"),  # declared unknown elsewhere: the known result wins
        (owned(final=FINAL), UNKNOWN, "adopt"),  # a known result stays: "unknown" never replaces it
        (owned(final=FINAL), FINAL, "adopt"),  # the first recorded final counts
        (owned(final=UNKNOWN), UNKNOWN, "adopt"),
    ],
)
def test_a_known_result_wins_over_a_recorded_unknown_outcome_and_never_the_reverse(
    stored: LedgerEntry | None, ours: FinalPublish, action: ConflictAction
) -> None:
    assert on_final_conflict(stored, ours, "A") == action
