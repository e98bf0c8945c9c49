"""When a message that never completed is dead-lettered: after ``max_deliver`` deliveries that each took
an ack wait (crashed or hung), not after deliveries a stopping replica handed back at once."""

from __future__ import annotations

from shared.bus.wire import hung_every_time, last_delivery, stored_age_s

NOW = 1_800_000_000_000_000_000  # ns


def ack(delivered: int, stored_ns: int, *, domain: bool = False) -> str:
    if domain:
        return f"$JS.ACK.hub.ACCHASH.LW_EVT.planner_events.{delivered}.10.10.{stored_ns}.0.r4nd"
    return f"$JS.ACK.LW_EVT.planner_events.{delivered}.10.10.{stored_ns}.0"


def test_the_age_is_read_from_both_layouts_of_the_ack_subject() -> None:
    assert stored_age_s(ack(3, NOW - 2_500_000_000), NOW) == 2.5
    assert stored_age_s(ack(3, NOW - 2_500_000_000, domain=True), NOW) == 2.5
    assert stored_age_s(ack(1, NOW + 10**9), NOW) == 0.0  # a server clock ahead of ours: not negative
    assert stored_age_s("_INBOX.abc", NOW) is None
    assert stored_age_s(None, NOW) is None
    assert stored_age_s("$JS.ACK.LW_EVT.planner_events.x.10.10.notanumber.0", NOW) is None


def test_within_the_limit_it_runs() -> None:
    assert not hung_every_time(6, 6, 0.1, 3.0)
    assert not hung_every_time(1, 6, None, 3.0)


def test_past_the_limit_after_as_many_ack_waits_it_is_dead_lettered() -> None:
    assert hung_every_time(7, 6, 18.0, 3.0)
    assert hung_every_time(7, 6, 600.0, 3.0)
    assert hung_every_time(7, 6, None, 3.0)  # no age to tell: as before


def test_past_the_limit_sooner_than_the_ack_waits_it_was_handed_back_and_runs_again() -> None:
    assert not hung_every_time(7, 6, 0.4, 3.0)
    assert not hung_every_time(7, 6, 17.9, 3.0)
    assert not hung_every_time(last_delivery(6) - 1, 6, 0.4, 3.0)


def test_the_consumers_last_delivery_is_dead_lettered_whatever_its_age() -> None:
    """Past ``last_delivery`` nats-server delivers it no more: it is never left undelivered in silence."""
    assert last_delivery(6) > 6 + 2  # room for a stopping 0.31 replica's open pull requests
    assert hung_every_time(last_delivery(6), 6, 0.4, 3.0)
