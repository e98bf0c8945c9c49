"""A run's record carries, of the messages its transactions produced, only those not yet in the
streams: what this replica published (every PubAck in) leaves the record at its next save, so the
record a step rewrites stays small. What a planner dies before publishing is still there for the
redelivery (``tests/stack/test_run_history.py``, ``tests/stack/test_inline_turns.py``).

Observed on the server, as a plain NATS subscriber sees the planner's saves (the real stack)."""

from __future__ import annotations

import itertools
import json

from loopwarden.client import Client
from shared import subjects as S
from shared.scenario import parse_scenario
from tests.support.runs import calculator_steps
from tests.support.timing import bound
from tests.support.wire import Wire


async def test_a_save_no_longer_carries_what_the_previous_one_published(one_client: Client) -> None:
    # one planner: on several, a run's next message may go to a replica that reads the record as the
    # last one stored it, and carries its outbox on (bounded all the same: MAX_OUTBOX)
    client = one_client
    async with Wire(client, f"$KV.{S.KV_RUNS}.>") as wire:
        run_id = await client.submit_scenario(parse_scenario(calculator_steps("record-outbox", 8)))
        state = await client.wait(run_id, timeout=bound(30))
    assert state.status == "completed", state.final_reason
    # as stored: an empty outbox is left out (``lean_json``), read as the planner reads it
    saves = [
        {"outbox": {}, **json.loads(m.data)} for m in wire.seen if m.subject == f"$KV.{S.KV_RUNS}.{run_id}" and m.data
    ]
    assert len(saves) >= 8, len(saves)  # a step's save: the outcome and the turn it scheduled, in one write
    for before, after in itertools.pairwise(saves):
        carried = {i["msg_id"] for items in before["outbox"].values() for i in items}
        again = [i for items in after["outbox"].values() for i in items if i["msg_id"] in carried]
        # only an advance whose turn was taken in place (never published) is carried on
        assert all(i["model"] == "RunAdvance" for i in again), again
        # beside advances, only the outboxes of what this save applied: a message and the turn it scheduled
        full = [k for k, items in after["outbox"].items() if any(i["model"] != "RunAdvance" for i in items)]
        assert len(full) <= 2, full  # (without dropping what was published: up to MAX_OUTBOX of them)
