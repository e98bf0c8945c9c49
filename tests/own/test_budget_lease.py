"""A budget decision's lease end to end (issue 36): a run whose tenant has no daily ceiling asks the governor
once per lease, not once per turn, and reports the calls it made on the lease with its next ask (the governor
learns its calibration from them); the thresholds still fire at the turn the rule says, each once; a tenant
with a ceiling asks at every turn.

A stack of its own: the session stack gives every tenant a daily ceiling (``tests/support/stacks.TEST_ENV``),
and a tenant with one gets no lease. Every budget request is watched on the wire by a plain subscriber.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from loopwarden.client import Client
from loopwarden.stack import LocalStack
from services.governor.budget import BudgetLedger
from shared import subjects as S
from shared.messages import BudgetRequest
from shared.scenario import parse_scenario
from tests.support.runs import budget_layers, calculator_steps
from tests.support.stacks import TEST_ENV, running, settings_for
from tests.support.timing import bound
from tests.support.wire import Wire

CAPPED = "capped"  # the one tenant with a daily ceiling here
ENV = {
    **{k: v for k, v in TEST_ENV.items() if k != "LW_TENANT_DAILY_CEILING_USD"},
    "LW_TENANT_CEILINGS": f'{{"{CAPPED}": 1000}}',
    "LW_BUDGET_LEASE_TURNS": "8",
    "LW_BUDGET_LEASE_S": "60",
}


@pytest.fixture(scope="module")
def lease_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    yield from running(
        LocalStack(
            state_dir=tmp_path_factory.mktemp("lease"),
            env=ENV,
            services=("planner", "executor", "validator", "governor", "judge"),
        )
    )


@pytest.fixture
async def lease_client(lease_stack: LocalStack) -> AsyncIterator[Client]:
    async with Client(settings_for(lease_stack)) as c:
        yield c


async def asks_of(
    client: Client, scenario: dict[str, Any], *, tenant: str | None = None
) -> tuple[Any, list[BudgetRequest]]:
    """The run of ``scenario`` (for ``tenant``: a client of its own), and the budget requests it made."""
    async with Wire(client, S.BUDGET_RESERVE) as wire:
        if tenant is None:
            run_id = await client.submit_scenario(parse_scenario(scenario))
            state = await client.wait(run_id, timeout=bound(60))
        else:
            async with Client(client.settings.model_copy(update={"tenant": tenant})) as theirs:
                run_id = await theirs.submit_scenario(parse_scenario(scenario))
                state = await theirs.wait(run_id, timeout=bound(60))
        await client.bus.nc.flush()
    asks = [BudgetRequest.model_validate_json(s.data) for s in wire.seen]
    return state, [a for a in asks if a.run_id == run_id]


async def test_a_run_asks_once_per_lease_and_reports_the_calls_it_made_on_it(lease_client: Client) -> None:
    client = lease_client
    state, asks = await asks_of(client, calculator_steps("leased", 12))
    assert state.status == "completed" and state.model_calls == 13
    # turn 1 asks and is given turns 2-9; turn 10 asks (reporting 2-9) and is given the rest
    assert [a.turn for a in asks] == [1, 10]
    assert asks[0].leased == []
    reported = asks[1].leased
    assert [c.turn for c in reported] == list(range(2, 10))
    assert all(c.prompt_tokens > 0 and c.usage.input_tokens > 0 for c in reported)
    called = {
        e.payload["iteration"]: e.payload["detail"]["input_tokens"]
        for e in await client.events(state.run_id)
        if e.payload.get("kind") == "model_called"
    }
    assert [c.usage.input_tokens for c in reported] == [called[t] for t in range(2, 10)]  # what each call was billed
    ledger, _ = await client.bus.kv_get(S.KV_BUDGETS, S.kv_key(state.run_id), BudgetLedger)
    assert ledger is not None and ledger.last_turn == 10 and ledger.leased_to == 18
    assert sorted(ledger.decisions, key=int) == ["1", "10"]
    assert ledger.decisions["1"].lease is not None and ledger.decisions["1"].lease.until_turn == 9


async def test_a_tenant_with_a_daily_ceiling_asks_at_every_turn_and_its_run_is_the_same(lease_client: Client) -> None:
    client = lease_client
    leased, few = await asks_of(client, calculator_steps("leased-again", 6))
    capped, every = await asks_of(client, calculator_steps("capped", 6), tenant=CAPPED)
    assert [a.turn for a in few] == [1]
    assert [a.turn for a in every] == list(range(1, 8))
    assert all(a.leased == [] for a in every)
    assert (capped.status, capped.model_calls, capped.usage.input_tokens, capped.usage.output_tokens) == (
        leased.status,
        leased.model_calls,
        leased.usage.input_tokens,
        leased.usage.output_tokens,
    )


async def test_on_leases_the_thresholds_still_fire_each_once_and_the_run_stops_within_its_budget(
    lease_client: Client,
) -> None:
    client = lease_client
    state, asks = await asks_of(client, budget_layers("budget-layers-leased"))
    kinds = [e.kind for e in await client.events(state.run_id) if e.kind.startswith("budget.")]
    assert kinds.count("budget.warn") == 1 and kinds.count("budget.block") == 1 and "budget.compact" in kinds
    assert kinds.index("budget.warn") < kinds.index("budget.block")
    assert state.status == "stopped" and "run token budget" in (state.final_reason or "")
    assert state.usage.input_tokens + state.usage.output_tokens <= 40_000
    assert len(asks) < state.model_calls + 1  # some turns were leased, and every threshold's turn asked
