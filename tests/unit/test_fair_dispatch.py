"""Fair dispatch inside one consumer (``shared/bus/fair.py``), rule by rule: which held message gets a slot."""

from __future__ import annotations

from shared.bus.fair import FairSlots


def fill(slots: FairSlots[str], key: str, n: int, weight: float = 1.0) -> list[str]:
    """``n`` items of ``key`` arrive; the ones that started at once."""
    return [item for i in range(n) if (item := slots.arrive(key, f"{key}{i}", weight)) is not None]


class TestATenantAlone:
    def test_takes_every_slot_then_holds_the_rest_in_order(self) -> None:
        slots: FairSlots[str] = FairSlots(limit=4, headroom=0.5)
        assert fill(slots, "a", 10) == ["a0", "a1", "a2", "a3"]  # no headroom for a tenant at its whole share
        assert len(slots) == 6
        assert slots.done("a") == ["a4"]
        assert slots.done("a") == ["a5"]

    def test_messages_without_a_tenant_share_one_key(self) -> None:
        slots: FairSlots[str] = FairSlots(limit=2)
        assert fill(slots, "", 3) == ["0", "1"]
        assert slots.done("") == ["2"]


class TestAnotherTenantArrives:
    def test_below_its_share_it_starts_at_once_past_the_limit_within_the_headroom(self) -> None:
        slots: FairSlots[str] = FairSlots(limit=8, headroom=0.25)  # 2 slots past the limit
        fill(slots, "a", 20)
        assert fill(slots, "b", 3) == ["b0", "b1"]  # the third waits: the headroom is used up
        assert slots.total == 10

    def test_what_it_could_not_start_goes_before_the_backlog_when_a_slot_frees(self) -> None:
        slots: FairSlots[str] = FairSlots(limit=8, headroom=0.25)
        fill(slots, "a", 20)
        fill(slots, "b", 3)
        # over the limit (10 running): the first two slots that free only bring it back to the limit
        assert slots.done("a") == []
        assert slots.done("a") == []
        assert slots.done("a") == ["b2"]  # b holds the fewest slots: next, ahead of a's 12 held
        assert slots.done("a") == ["a8"]

    def test_without_headroom_it_waits_for_slots_then_takes_them_until_it_has_its_share(self) -> None:
        slots: FairSlots[str] = FairSlots(limit=4, headroom=0)
        fill(slots, "a", 10)
        assert fill(slots, "b", 3) == []
        assert slots.done("a") == ["b0"]
        assert slots.done("a") == ["b1"]
        assert slots.done("a") == ["a4"]  # b has 2 of 4: its share; then turn about
        assert slots.done("b") == ["b2"]

    def test_at_its_share_it_queues_like_anyone(self) -> None:
        slots: FairSlots[str] = FairSlots(limit=4, headroom=1.0)
        fill(slots, "a", 10)
        assert fill(slots, "b", 5) == ["b0", "b1"]  # half of 4 slots: b's share with two tenants
        assert slots.keys() == {"a": 6, "b": 3}


def serve(slots: FairSlots[str], running: list[str], n: int) -> list[str]:
    """End the oldest running item ``n`` times; the items that started, in order."""
    started: list[str] = []
    for _ in range(n):
        now = slots.done(running.pop(0)[0])
        running += now
        started += now
    return started


class TestShares:
    def test_two_tenants_with_a_backlog_share_the_slots_by_weight(self) -> None:
        slots: FairSlots[str] = FairSlots(limit=3, headroom=0)
        running = fill(slots, "a", 3, weight=2)
        fill(slots, "a", 60, weight=2)
        fill(slots, "b", 60, weight=1)
        served = serve(slots, running, 60)
        keys = [item[0] for item in served]
        assert abs(keys.count("a") - 40) <= 2 and abs(keys.count("b") - 20) <= 2
        assert sorted(item[0] for item in running) == ["a", "a", "b"]  # 2:1 of the slots

    def test_a_tenant_back_after_idling_gets_no_credit_for_the_time_away(self) -> None:
        slots: FairSlots[str] = FairSlots(limit=2, headroom=0)
        running = fill(slots, "a", 2)
        fill(slots, "b", 1)
        running += serve(slots, running, 1)
        fill(slots, "a", 40)
        serve(slots, running, 30)  # b idle (its one item done): a served alone
        fill(slots, "b", 10)
        keys = [item[0] for item in serve(slots, running, 10)]
        assert keys[:2] == ["b", "a"] or keys[:2] == ["a", "b"]  # one slot each, not b's ten in a row
        assert keys.count("b") == 5


def test_messages_of_one_tenant_start_in_the_order_they_came() -> None:
    slots: FairSlots[str] = FairSlots(limit=1, headroom=1.0)
    running = fill(slots, "a", 1)
    running += fill(slots, "b", 5)  # b0 at once, past the limit (the headroom)
    started = list(running)
    started += serve(slots, running, 5)
    assert [i for i in started if i[0] == "b"] == ["b0", "b1", "b2", "b3", "b4"]


def test_drain_hands_back_everything_held() -> None:
    slots: FairSlots[str] = FairSlots(limit=1)
    fill(slots, "a", 3)
    fill(slots, "b", 2)
    assert sorted(slots.drain()) == ["a1", "a2", "b0", "b1"]
    assert len(slots) == 0 and slots.done("a") == []


def test_a_clients_submit_is_its_subjects_tenant_whatever_its_headers_say() -> None:
    from nats.aio.msg import Msg

    from shared import subjects as S
    from shared.bus.pulls import _Pull

    forged = {"Lw-Tenant": "someone-else", "Lw-Tenant-Weight": "999"}
    stored = S.RUN_SUBMIT_PREFIX + ".3.acme"  # as LW_SUBMIT stores it: under its partition of the door
    assert _Pull.tenant_of(Msg(None, subject=stored, headers=forged)) == ("acme", 1.0)  # type: ignore[arg-type]
    replay = S.run_replay("acme")
    assert _Pull.tenant_of(Msg(None, subject=replay, headers=forged)) == ("acme", 1.0)  # type: ignore[arg-type]
    command = S.tool_execute("calculator")
    assert _Pull.tenant_of(Msg(None, subject=command, headers=forged)) == ("someone-else", 999.0)  # type: ignore[arg-type]


class TestYieldingItsShare:
    """``yield_share`` (``LW_DISPATCH_YIELD``): while another tenant has messages running, a tenant that holds its
    share takes no slot that frees; alone, it takes every one."""

    def test_a_backlog_at_its_share_leaves_freed_slots_while_another_tenant_runs(self) -> None:
        slots: FairSlots[str] = FairSlots(limit=4, headroom=0.5, yield_share=True)
        fill(slots, "a", 10)
        assert fill(slots, "b", 1) == ["b0"]  # below its share: at once, within the headroom
        assert slots.done("a") == []  # 4 running: a holds 3, its share is 2
        assert slots.done("a") == []  # a holds 2 = its share, b runs: the slot stays free
        assert slots.total == 3 and slots.running == {"a": 2, "b": 1}
        assert slots.done("b") == ["a4", "a5"]  # b is done: a alone takes every slot again
        assert slots.total == 4

    def test_without_it_a_backlog_takes_every_slot_that_frees(self) -> None:
        slots: FairSlots[str] = FairSlots(limit=4, headroom=0.5)
        fill(slots, "a", 10)
        fill(slots, "b", 1)
        assert slots.done("a") == []
        assert slots.done("a") == ["a4"]  # back to the limit: a's next starts
