"""The planner's tool catalogue is listed once for all the messages in flight (issue 8).

A replica handles many messages at once; when its 2-second catalogue cache expires, every turn in
flight used to list the bucket itself (a consumer on the bucket's stream plus a get per contract
each). Against the session's real NATS server: 32 turns asking at once share one listing (the
bucket's stream gains at most a few listing consumers, not 32), and a refresh lists again.
"""

from __future__ import annotations

import asyncio

from loopwarden.stack import LocalStack
from services.planner.handlers import Planner
from shared import subjects as S
from shared.bus import Bus
from shared.telemetry import setup_telemetry
from tests.support.stacks import settings_for


async def test_turns_in_flight_share_one_catalogue_listing(stack: LocalStack) -> None:
    settings = settings_for(stack)
    bus = Bus(settings, "planner-under-test")
    await bus.connect()
    planner = Planner(bus, settings, setup_telemetry("planner-under-test", settings))
    stream = f"KV_{S.KV_CONTRACTS}"
    try:
        before = (await bus.js.stream_info(stream)).state.consumer_count
        got = await asyncio.gather(*(planner.contracts() for _ in range(32)))
        after = (await bus.js.stream_info(stream)).state.consumer_count
        assert got[0] and all(g is got[0] for g in got)  # one listing's result, for every turn
        assert after - before <= 4, f"{after - before} listing consumers for 32 turns in flight"
        assert await planner.contracts() is got[0]  # cached
        refreshed = await planner.contracts(refresh=True)  # a tool registered a moment ago: listed again
        assert refreshed is not got[0] and refreshed.keys() == got[0].keys()
    finally:
        await bus.stop()
