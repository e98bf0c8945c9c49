"""Flow control's rules as plain functions (``shared/flow/``): admission by weighted fair share, the fleet's
record, the sweep, the quotas checked at the door, a tenant's day of spend, the fleet's view."""

from __future__ import annotations

from shared.flow import (
    FleetRecord,
    Share,
    TenantDay,
    Usage,
    admit,
    capacity_of,
    dequeue,
    drift,
    due,
    enqueue,
    fleet_view,
    forget_stored,
    heartbeat,
    hold,
    live_planners,
    pick,
    plan,
    recount,
    refusal,
    release,
    submit_stream_refusal,
    take_at_once,
    verdict,
)
from shared.tenancy import Policy


def policy(tenant: str = "acme", **kw: object) -> Policy:
    base: dict[str, object] = {
        "weight": 1.0,
        "max_running": None,
        "max_runs": None,
        "max_human_items": None,
        "max_stored_bytes": None,
        "daily_ceiling_usd": None,
    }
    return Policy(tenant=tenant, **{**base, **kw})  # type: ignore[arg-type]


# --- who is admitted ---------------------------------------------------------------------------------------
def test_a_full_fleet_admits_no_one() -> None:
    assert pick([Share("a", queued={5: 3}, running=4)], capacity=4) is None


def test_nothing_waiting_admits_no_one() -> None:
    assert pick([Share("a", running=1), Share("b")], capacity=10) is None


def test_the_slot_goes_to_the_tenant_with_the_fewest_runs_per_weight() -> None:
    shares = [Share("a", running=6, queued={5: 100}), Share("b", running=2, queued={5: 1})]
    assert pick(shares, capacity=10) == ("b", 5)
    heavy = [Share("a", weight=4, running=6, queued={5: 100}), Share("b", running=2, queued={5: 1})]
    assert pick(heavy, capacity=10) == ("a", 5)  # 6/4 < 2/1


def test_a_tenant_at_its_cap_waits_even_with_room_in_the_fleet() -> None:
    shares = [Share("a", cap=2, running=2, queued={5: 9})]
    assert pick(shares, capacity=10) is None
    assert pick([*shares, Share("b", running=5, queued={1: 1})], capacity=10) == ("b", 1)


def test_within_a_tenant_the_highest_priority_goes_first() -> None:
    assert pick([Share("a", queued={2: 5, 7: 1, 9: 0})], capacity=3) == ("a", 7)


def test_ties_go_to_the_longest_waiting_then_by_name() -> None:
    assert pick([Share("a", queued={5: 1}, since=20.0), Share("b", queued={5: 1}, since=10.0)], capacity=2) == (
        "b",
        5,
    )
    assert pick([Share("b", queued={5: 1}), Share("a", queued={5: 1})], capacity=2) == ("a", 5)


def test_a_tenant_alone_fills_the_whole_fleet() -> None:
    assert len(plan([Share("a", queued={5: 1000})], capacity=128, limit=1000)) == 128


def test_a_backlog_does_not_delay_another_tenant_beyond_its_share() -> None:
    """a's 1,000 queued before b's 20: as slots free, b gets every other one until its runs are in."""
    shares = [Share("a", queued={5: 1000}, since=1.0, running=10), Share("b", queued={5: 20}, since=2.0)]
    picks = plan(shares, capacity=30, limit=20)
    assert [t for t, _ in picks].count("b") == 15  # b catches up to a's 10, then they alternate
    assert picks[:10] == [("b", 5)] * 10


def test_a_tenant_below_its_share_starts_past_a_full_fleet_within_the_headroom() -> None:
    full = [Share("a", running=100, queued={5: 900}), Share("b", queued={5: 20})]
    assert pick(full, capacity=100) is None  # no headroom: b waits for a's runs to end
    picks = plan(full, capacity=100, limit=100, headroom=10)
    assert picks == [("b", 5)] * 10  # b below its share (50): its first ten at once, a nothing past the capacity
    assert pick([Share("a", running=100, queued={5: 9})], capacity=100, headroom=10) is None  # a alone: no further
    # past the capacity only up to the headroom, and only while below the share
    below = [Share("a", running=60, queued={5: 9}), Share("b", running=45, queued={5: 9})]
    assert pick(below, 100, headroom=20) == ("b", 5)
    at_share = [Share("a", running=60, queued={5: 9}), Share("b", running=50, queued={5: 9})]
    assert pick(at_share, 100, headroom=20) is None
    over = [Share("a", running=80, queued={5: 9}), Share("b", running=40, queued={5: 9})]
    assert pick(over, 100, headroom=20) is None  # the headroom is used up


def test_weights_share_the_fleet_in_proportion() -> None:
    picks = plan([Share("a", weight=3, queued={5: 99}), Share("b", queued={5: 99})], capacity=40, limit=40)
    assert [t for t, _ in picks].count("a") == 30


def test_capacity_is_the_setting_else_per_live_planner() -> None:
    assert capacity_of(50, live_planners=3, per_planner=128) == 50
    assert capacity_of(None, live_planners=2, per_planner=128) == 256
    assert capacity_of(None, live_planners=0, per_planner=128) == 128


# --- the fleet's record ------------------------------------------------------------------------------------
def test_admitting_and_releasing_keep_each_tenants_runs_and_the_minutes_figures() -> None:
    rec = FleetRecord()
    assert admit(rec, "a", "r1", now=600.0, waited_s=3.0)
    assert not admit(rec, "a", "r1", now=601.0)  # taken again (a redelivery): once
    assert admit(rec, "b", "r2", now=602.0, waited_s=1.0)
    assert rec.total == 2 and rec.running_of("a") == 1
    assert release(rec, "r1", now=660.0, ended=True, stored_bytes=4096)
    assert not release(rec, "r1", now=661.0, ended=True)  # released once
    assert rec.running_of("a") == 0 and "a" not in rec.running
    assert rec.finished["a"] == {"11": 1} and rec.stored["a"] == 4096
    assert rec.waited["a"]["10"] == [3.0, 1.0]
    assert release(rec, "r2", now=700.0, ended=False)  # waits for a person: not finished
    assert "b" not in rec.finished
    assert hold(rec, "b", "r2", now=710.0) and rec.running_of("b") == 1  # its resumption: no queue
    assert forget_stored(rec, "a", 1000) and rec.stored["a"] == 3096


def test_old_minutes_leave_the_record() -> None:
    rec = FleetRecord()
    admit(rec, "a", "r1", now=0.0, waited_s=1.0)
    release(rec, "r1", now=0.0, ended=True)
    admit(rec, "a", "r2", now=3600.0, waited_s=1.0)
    release(rec, "r2", now=3600.0, ended=True)
    assert list(rec.finished["a"]) == ["60"] and list(rec.waited["a"]) == ["60"]


def test_replicas_are_alive_while_they_say_so() -> None:
    rec = FleetRecord()
    assert heartbeat(rec, "p1", now=100.0, ttl=6.0)
    assert heartbeat(rec, "p2", now=101.0, ttl=6.0)
    assert not heartbeat(rec, "p1", now=101.0, ttl=6.0)  # fresh enough: no write for it alone
    assert live_planners(rec, now=102.0, ttl=6.0) == 2
    assert heartbeat(rec, "p1", now=108.0, ttl=6.0)  # p2 not seen for 7 s: gone
    assert list(rec.replicas) == ["p1"] and live_planners(rec, now=108.0, ttl=6.0) == 1


def test_a_submit_is_counted_as_waiting_only_when_its_quota_allows() -> None:
    rec = FleetRecord()
    quota = policy("a", max_runs=2)
    assert enqueue(rec, quota, 5, Usage()) is None
    assert enqueue(rec, quota, 9, Usage()) is None
    assert rec.queued_by("a") == {5: 1, 9: 1}
    refused = enqueue(rec, quota, 5, Usage())
    assert refused is not None and (refused.quota, refused.current) == ("max_runs", 2)
    assert rec.queued_of("a") == 2  # a refused submit is not counted
    admit(rec, "a", "r1", now=1.0, priority=9)
    assert rec.queued_by("a") == {5: 1} and rec.running_of("a") == 1
    # runs waiting for a person count too (they come from the escalation service's figures)
    assert enqueue(rec, quota, 5, Usage(waiting=1)) is not None
    assert dequeue(rec, "a", 5) and not dequeue(rec, "a", 5) and "a" not in rec.queued


def test_a_submit_starts_at_once_only_when_nothing_waits_and_there_is_room() -> None:
    rec = FleetRecord()
    a = policy("a")
    assert enqueue(rec, a, 5, Usage()) is None and take_at_once(rec, a, 5, "r1", capacity=2, now=1.0)
    assert rec.running_of("a") == 1 and rec.waiting == 0  # counted in flight, not waiting
    assert enqueue(rec, a, 5, Usage()) is None and take_at_once(rec, a, 5, "r2", capacity=2, now=1.0)
    assert enqueue(rec, a, 5, Usage()) is None and not take_at_once(rec, a, 5, "r3", capacity=2, now=1.0)  # full
    assert rec.waiting == 1
    # a run already waiting anywhere goes first: the new one waits its turn, even with room
    rec2 = FleetRecord(queued={"b": {"5": 1}})
    assert enqueue(rec2, a, 9, Usage()) is None and not take_at_once(rec2, a, 9, "r4", capacity=10, now=1.0)
    capped = FleetRecord()
    one = policy("c", max_running=1)
    assert enqueue(capped, one, 5, Usage()) is None and take_at_once(capped, one, 5, "r5", capacity=10, now=1.0)
    assert enqueue(capped, one, 5, Usage()) is None and not take_at_once(capped, one, 5, "r6", capacity=10, now=1.0)


def test_waiting_counts_follow_the_tickets_when_they_drift() -> None:
    rec = FleetRecord(queued={"a": {"5": 3}, "b": {"1": 1}})
    assert drift(rec, {"a": {5: 3}, "b": {1: 1}}) == {}
    lasting = drift(rec, {"a": {5: 2}, "c": {9: 1}})
    assert lasting == {("a", 5): 2, ("b", 1): 0, ("c", 9): 1}
    assert recount(rec, lasting)
    assert rec.queued == {"a": {"5": 2}, "c": {"9": 1}}
    assert not recount(rec, lasting)


# --- the sweep ---------------------------------------------------------------------------------------------
def test_the_sweep_looks_at_runs_past_the_grace_longest_unchecked_first() -> None:
    running = {"new": 99.0, "old": 10.0, "older": 5.0, "seen": 1.0}
    checked = {"seen": 95.0, "old": 50.0}
    assert due(running, checked, now=100.0, grace=10.0, every=10.0, batch=2) == ["older", "old"]


def test_a_slot_is_kept_by_a_running_run_only() -> None:
    assert verdict("running") == "keep"
    assert verdict("queued") == "start"  # admitted, its admitter died before starting it
    for status in ("completed", "failed", "stopped", "refused", "awaiting_human", None):
        assert verdict(status) == "release"


# --- quotas at the door ------------------------------------------------------------------------------------
def test_nothing_over_a_quota_is_accepted_and_the_refusal_names_it() -> None:
    assert refusal(policy(max_runs=3), Usage(queued=1, running=1)) is None
    r = refusal(policy(max_runs=3), Usage(queued=1, running=1, waiting=1))
    assert r is not None and (r.quota, r.limit, r.current) == ("max_runs", 3, 3)
    assert "3 runs queued, running or waiting for a person" in r.reason
    r = refusal(policy(max_human_items=2), Usage(human_items=2))
    assert r is not None and (r.quota, r.limit, r.current) == ("max_human_items", 2, 2)
    r = refusal(policy(max_stored_bytes=4096), Usage(stored_bytes=5000))
    assert r is not None and (r.quota, r.current) == ("max_stored_bytes", 5000)


def test_a_tenant_at_its_daily_ceiling_is_refused_first() -> None:
    r = refusal(policy(daily_ceiling_usd=0.012, max_runs=1), Usage(spent_usd=0.0125, running=5))
    assert r is not None and (r.quota, r.limit, r.current) == ("daily_ceiling_usd", 0.012, 0.0125)
    assert "$0.012 today" in r.reason
    assert refusal(policy(daily_ceiling_usd=0.012), Usage(spent_usd=0.0119)) is None


def test_a_full_submit_stream_is_a_typed_refusal() -> None:
    r = submit_stream_refusal("maximum messages exceeded", limit=100, current=100)
    assert (r.quota, r.limit, r.current) == ("submit_stream", 100, 100) and "LW_SUBMIT" in r.reason


# --- a tenant's day ----------------------------------------------------------------------------------------
def test_a_tenants_day_counts_each_run_once_and_stays_small() -> None:
    day = TenantDay(tenant="a", day="2026-01-01")
    assert day.spend("r1", 0.01) and day.spend("r1", 0.02)
    assert not day.spend("r1", 0.015)  # an older total changes nothing
    assert day.spend("r2", 0.5)
    assert day.settle("r1", 0.03) and not day.settle("r1", 0.03)  # a redelivered final event
    assert not day.spend("r1", 0.04)  # settled: a late budget request does not add it again
    assert day.spent_usd == 0.53 and day.runs == {"r2": 0.5} and day.settled_runs == 1
    old = TenantDay.model_validate({"tenant": "a", "day": "d", "runs": {"x": 1.0}})  # an earlier release's record
    assert old.spent_usd == 1.0


# --- the view ----------------------------------------------------------------------------------------------
def test_the_view_shows_each_tenants_queue_slots_rates_waits_and_quotas() -> None:
    rec = FleetRecord()
    for k in range(3):
        admit(rec, "a", f"r{k}", now=600.0, waited_s=2.0)
    release(rec, "r0", now=610.0, ended=True)
    rec.queued = {"a": {"5": 4, "9": 1}}
    view = fleet_view(
        rec,
        oldest={"a": 590.0},
        policies={"a": policy("a", max_runs=10), "b": policy("b")},
        open_items={"b": 2},
        spent={"a": 0.25},
        now=630.0,
        capacity=8,
        planners=2,
    )
    a, b = view.tenants
    assert (view.capacity, view.running, view.queued, view.planners) == (8, 2, 5, 2)
    assert (a.queued, a.running, a.queued_by_priority, a.oldest_wait_s, a.waited_s) == (
        5,
        2,
        {"9": 1, "5": 4},
        40.0,
        2.0,
    )
    assert a.finished_per_min > 0
    runs = next(q for q in a.quotas if q.quota == "max_runs")
    assert (runs.limit, runs.current) == (10, 7)
    assert b.waiting_for_people == 2 and b.running == 0


def test_a_record_copied_to_change_is_equal_and_shares_nothing_with_its_original() -> None:
    record = FleetRecord()
    admit(record, "a", "run-1", 600.0, waited_s=2.0, priority=None)
    admit(record, "b", "run-2", 601.0)
    release(record, "run-2", 602.0, ended=True, stored_bytes=10, rate_limited_s=1.5)
    record.queued["a"] = {"0": 3}
    heartbeat(record, "planner-1", 600.0, ttl=6.0)
    # every field set, so a field added later and not copied by hand shows here
    assert all(getattr(record, name) for name in FleetRecord.model_fields), record
    copy = record.copy_to_change()
    assert copy == record and copy.model_dump_json() == record.model_dump_json()
    admit(copy, "a", "run-3", 603.0, waited_s=1.0)
    release(copy, "run-1", 604.0, ended=True, stored_bytes=5, rate_limited_s=1.0)
    copy.queued["a"]["0"] = 1
    heartbeat(copy, "planner-2", 603.0, ttl=6.0)
    assert record.running == {"a": {"run-1": 600.0}} and record.queued == {"a": {"0": 3}}
    assert list(record.replicas) == ["planner-1"] and record.stored == {"b": 10}
    assert record.finished == {"b": {"10": 1}} and record.waited["a"]["10"] == [2.0, 1.0]
    assert record.rate_limited["b"]["10"] == [1.5, 1.0]


def test_a_tenant_ahead_of_a_backlog_starts_at_once_as_the_next_round_would_start_it() -> None:
    """a fills the fleet (4 of 4) with 6 more waiting; b's submits start at once while b is below its share and the
    headroom has room (the round would pick b first), then wait; a's own next submit waits behind its backlog."""
    rec = FleetRecord(running={"a": {f"a{k}": 0.0 for k in range(4)}}, queued={"a": {"5": 6}})
    a, b = policy("a"), policy("b")
    others = {"a": a}
    assert enqueue(rec, b, 5, Usage()) is None
    assert take_at_once(rec, b, 5, "b1", capacity=4, now=1.0, others=others, headroom=2)
    assert enqueue(rec, b, 5, Usage()) is None
    assert take_at_once(rec, b, 5, "b2", capacity=4, now=1.0, others=others, headroom=2)
    assert enqueue(rec, b, 5, Usage()) is None  # the headroom is used up: b waits its turn
    assert not take_at_once(rec, b, 5, "b3", capacity=4, now=1.0, others=others, headroom=2)
    assert rec.running_of("b") == 2 and rec.queued_of("b") == 1
    assert enqueue(rec, a, 5, Usage()) is None and not take_at_once(rec, a, 5, "a9", capacity=4, now=1.0, others=others)


def test_a_tie_or_a_heavier_tenant_waiting_keeps_a_submit_in_the_queue() -> None:
    # room in the fleet, another tenant waits with as few runs in flight: the rounds decide (the queue's order)
    rec = FleetRecord(running={"a": {"a1": 0.0}}, queued={"a": {"5": 1}})
    b = policy("b")
    assert enqueue(rec, b, 5, Usage()) is None
    assert rec.running_of("b") == 0
    rec.running["b"] = {"b0": 0.0}
    assert not take_at_once(rec, b, 5, "b1", capacity=10, now=1.0, others={"a": policy("a")})
    # a weight-3 tenant with 2 in flight is ahead of b with 1 (2/3 < 1): b waits
    heavy = FleetRecord(running={"h": {"h1": 0.0, "h2": 0.0}, "b": {"b0": 0.0}}, queued={"h": {"5": 4}})
    assert enqueue(heavy, b, 5, Usage()) is None
    assert not take_at_once(heavy, b, 5, "b1", capacity=10, now=1.0, others={"h": policy("h", weight=3)})
