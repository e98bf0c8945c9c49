"""An escalation item carries what a person needs to act even when the run's record travels by reference.

The planner's record in ``lw_runs`` is a claim-check reference once it is larger than the inline limit
(here 1 KiB, so every record is). The escalation service once read that record as raw JSON to find the
call's arguments and error and the run's last turns: a record stored by reference silently gave it
nothing. Now the raiser puts the call's arguments, error and failure in the item's typed details, the
service reads no run record at all, and the reader that shows the item (``Client.show``) reads the run's
last turns as the published ``RunSnapshot`` through the bus (which follows the reference). One stack for
the module: planner, executor, validator, governor and escalation service.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
import yaml

from loopwarden.client import Client
from loopwarden.stack import LocalStack
from shared import subjects as S
from shared.payloads import KV_REF_KEY
from shared.scenario import parse_scenario
from tests.support.paths import ROOT
from tests.support.runs import escalations_of
from tests.support.stacks import TEST_ENV, running, settings_for
from tests.support.timing import bound

SMALL = {**TEST_ENV, "LW_PAYLOAD_INLINE_LIMIT_BYTES": "1024"}  # the least the settings allow


@pytest.fixture(scope="module")
def small_inline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    services = ("planner", "executor", "validator", "governor", "escalation")
    yield from running(LocalStack(state_dir=tmp_path_factory.mktemp("by-reference"), env=SMALL, services=services))


@pytest.fixture
async def ref_client(small_inline: LocalStack) -> AsyncIterator[Client]:
    async with Client(settings_for(small_inline)) as c:
        yield c


async def test_a_schema_cap_item_has_the_calls_arguments_error_and_the_last_turns_when_the_record_is_a_reference(
    ref_client: Client,
) -> None:
    scenario = yaml.safe_load((ROOT / "scenarios" / "correction-escalates.yaml").read_text())
    run_id = await ref_client.submit_scenario(parse_scenario(scenario))
    state = await ref_client.wait(run_id, timeout=bound(30), until=("awaiting_human",))
    assert state.status == "awaiting_human", state.final_reason
    stored = (await (await ref_client.bus.kv(S.KV_RUNS)).get(run_id)).value or b""
    assert stored.startswith(b'{"' + KV_REF_KEY.encode()), stored[:80]  # the record travels by reference
    [item] = await escalations_of(ref_client, run_id)
    assert (item.kind, item.tool) == ("schema_cap", "calculator")
    assert item.details.get("arguments") == {"expr": "1+1"}, item.details
    assert item.details.get("failure_type") == "input_invalid"
    assert "expression" in str(item.details.get("error"))  # the error the model read names the missing field
    shown = (await ref_client.show(item.escalation_id)).escalations[0]  # the last turns, read from the run
    assert shown.context and "Add one and one" in shown.context[0].text()
    assert (await ref_client.resolve(item.escalation_id, "oncall", "abort")).ok
    assert (await ref_client.wait(run_id, timeout=bound(30))).status == "stopped"
