"""One reader of the contract catalogue (``lw_contracts``) with one freshness rule: the planner's
listing and the validator's per-tool read both see a re-registered contract within ``FRESH_S``, and
both serve a fresh read without asking the server. Against the session's real NATS server."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from loopwarden.stack import LocalStack
from services.planner.catalogue import Catalogue
from services.validator.handlers import Validator
from shared import subjects as S
from shared.bus import Bus, TryLater
from shared.contracts import catalogue
from shared.contracts.catalogue import ContractCatalogue
from shared.messages import ToolContract
from shared.telemetry import setup_telemetry
from tests.support.stacks import settings_for
from tests.support.timing import polls

FRESH_S = 0.3  # the rule under test, short so the test waits it out


@pytest.fixture
async def bus(stack: LocalStack, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Bus]:
    monkeypatch.setattr(catalogue, "FRESH_S", FRESH_S)
    b = Bus(settings_for(stack), "catalogue-under-test")
    await b.connect()
    yield b
    await b.stop()


def contract(name: str, description: str) -> ToolContract:
    return ToolContract.model_validate(
        {"name": name, "description": description, "inputSchema": {"type": "object"}, "outputSchema": {}}
    )


async def test_a_re_registered_contract_is_seen_by_every_reader_within_the_same_time(bus: Bus) -> None:
    name = f"cat_{uuid.uuid4().hex[:8]}"
    await bus.kv_put(S.KV_CONTRACTS, S.kv_key(name), contract(name, "first"))
    try:
        readers = ContractCatalogue(bus)
        planner = Catalogue(bus)
        validator = Validator(bus, setup_telemetry("validator-under-test", bus.settings))
        assert (await readers.get(name)).description == "first"  # type: ignore[union-attr]
        assert (await readers.all())[name].description == "first"
        assert (await planner.contracts())[name].description == "first"
        assert (await validator.contract(name)).description == "first"

        await bus.kv_put(S.KV_CONTRACTS, S.kv_key(name), contract(name, "second"))
        # fresh reads are served as read: no reader asks the server again within FRESH_S
        assert (await readers.get(name)).description == "first"  # type: ignore[union-attr]
        assert (await readers.all())[name].description == "first"
        assert (await planner.contracts())[name].description == "first"
        assert (await validator.contract(name)).description == "first"

        await asyncio.sleep(FRESH_S * 1.5)
        assert (await readers.get(name)).description == "second"  # type: ignore[union-attr]
        assert (await readers.all())[name].description == "second"
        assert (await planner.contracts())[name].description == "second"
        assert (await validator.contract(name)).description == "second"
    finally:  # the session's stack is shared: a tool left registered changes every later run's catalogue
        await (await bus.kv(S.KV_CONTRACTS)).purge(S.kv_key(name))


async def test_a_tool_nobody_registered_reads_as_absent_and_the_validator_hands_its_result_back(bus: Bus) -> None:
    name = f"cat_none_{uuid.uuid4().hex[:8]}"
    assert await ContractCatalogue(bus).get(name) is None
    validator = Validator(bus, setup_telemetry("validator-under-test", bus.settings))
    with pytest.raises(TryLater, match=f"no contract registered for tool '{name}'"):
        await validator.contract(name)


async def test_a_read_past_half_its_freshness_is_served_and_read_again_in_the_background(bus: Bus) -> None:
    """A reader that keeps handling steps never waits for the catalogue: past ``FRESH_S / 2`` it is served
    what it read and reads again beside it, so the re-registered contract is there for the next step."""
    name = f"cat_ahead_{uuid.uuid4().hex[:8]}"
    await bus.kv_put(S.KV_CONTRACTS, S.kv_key(name), contract(name, "first"))
    try:
        readers = ContractCatalogue(bus)
        assert (await readers.get(name)).description == "first"  # type: ignore[union-attr]
        assert (await readers.all())[name].description == "first"
        await bus.kv_put(S.KV_CONTRACTS, S.kv_key(name), contract(name, "second"))
        await asyncio.sleep(FRESH_S * 0.6)
        assert (await readers.get(name)).description == "first"  # type: ignore[union-attr]  # served at once
        assert (await readers.all())[name].description == "first"
        for _ in range(polls(50)):  # the reads ahead land
            await asyncio.sleep(0.02)
            if readers.cached() is not None and readers.cached()[name].description == "second":  # type: ignore[index]
                break
        assert (await readers.all())[name].description == "second"
        assert (await readers.get(name)).description == "second"  # type: ignore[union-attr]
    finally:
        await (await bus.kv(S.KV_CONTRACTS)).purge(S.kv_key(name))
