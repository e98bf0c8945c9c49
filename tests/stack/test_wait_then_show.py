"""A run reported as waiting for a human has its queue item already there (issue 28, item 5).

The planner saves the run as ``awaiting_human`` and raises the escalation; the escalation service files
the item a moment later. ``loopwarden submit --wait`` exits 5 and the user's next command is
``escalations show ID``: it must not answer "no escalation". Before ``Client.wait`` waited for the item,
about one run in eight was shown as missing right after the wait returned."""

from __future__ import annotations

import asyncio

from loopwarden.client import Client
from shared.scenario import load_scenario
from tests.support.paths import ROOT
from tests.support.timing import bound

ESCALATES = ROOT / "scenarios" / "correction-escalates.yaml"


async def test_the_item_a_waiting_run_names_is_in_the_queue_when_wait_returns(client: Client) -> None:
    scenario = load_scenario(ESCALATES)

    async def one() -> tuple[str, bool]:
        run_id = await client.submit_scenario(scenario)
        state = await client.wait(run_id, timeout=bound(90), until=("completed", "failed", "stopped", "awaiting_human"))
        assert state.status == "awaiting_human" and state.awaiting is not None, state.status
        shown = await client.show(state.awaiting.escalation_id)  # at once, as the next CLI command would
        return run_id, shown.ok

    results = await asyncio.gather(*(one() for _ in range(12)))
    missing = [run for run, ok in results if not ok]
    assert not missing, f"runs reported waiting whose item the queue did not have yet: {missing}"
