"""Flow control on a locked stack (issue 34, issue 35 item 1): a tenant-bound client (``client_acme``, its own
NATS user, reading its runs only through the planner) sees its queued run as queued, its refused submit as
refused at once with the quota, the limit and the current figure (``Client.submit`` and ``Client.wait`` raise
it, ``state`` reads it), and its own row of the fleet's view; the services run as their own users and none is
refused anything it does (``locked_stack`` checks the logs for permission violations)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from loopwarden.client import Client, QuotaExceeded
from shared.canonical import digest_of
from shared.messages import RunSubmit
from shared.scenario import parse_scenario
from shared.settings import Settings
from tests.support import locked as L
from tests.support.stacks import TEST_ENV
from tests.support.timing import bound

STACK_ENV = {
    **TEST_ENV,
    "LW_PLANNER_PROVIDER": "scripted",
    "LW_TENANT_CEILINGS": '{"default": 1000, "acme": 1000}',
    "LW_FLOW_CAPACITY": "1",
    "LW_TENANTS": json.dumps({"acme": {"max_runs": 2}}),
}
SERVICES = ("planner", "executor", "validator", "governor", "escalation")


LOCKED = L.OwnLocked("flow-locked", SERVICES, STACK_ENV)  # the module's ``locked``


def as_user(url: str, user: str, **overrides: Any) -> Settings:
    return L.as_user(url, user, manage_streams=False, rpc_timeout_s=3, **overrides)


def slow(seconds: float) -> RunSubmit:
    sc = parse_scenario({"name": "slow", "task": "Wait.", "planner": [{"latency_s": seconds, "text": "done"}]})
    data = sc.model_dump(mode="json", by_alias=True)
    return RunSubmit(
        run_id=f"run-{uuid.uuid4().hex[:20]}",
        task=sc.task,
        answer_mode="text",
        scenario=data,
        scenario_digest=digest_of(data),
    )


async def test_a_tenant_bound_client_reads_its_queued_and_refused_runs_and_its_row_of_the_fleet(
    acme: Client, locked_client: Client
) -> None:
    running = await acme.submit(slow(3.0))
    queued = await acme.submit(slow(0.1))  # the fleet's one slot is taken: it waits
    snap = await acme.state(queued)
    assert snap is not None and snap.status == "queued" and snap.tenant == "acme" and snap.priority == 5
    with pytest.raises(QuotaExceeded) as refused:
        await acme.submit(slow(0.1))
    assert (refused.value.quota, refused.value.limit, refused.value.current) == ("max_runs", 2, 2)
    record = await acme.state(refused.value.run_id)
    assert record is not None and record.status == "refused" and record.refusal is not None
    assert record.refusal.quota == "max_runs" and "tenant acme has 2 runs" in record.refusal.reason
    with pytest.raises(QuotaExceeded):  # waiting for it ends at once, with the refusal
        await acme.wait(refused.value.run_id, timeout=bound(10))
    events = [e.kind for e in await acme.events(refused.value.run_id)]
    assert events == ["run.refused"]
    mine = await acme.fleet()
    assert [t.tenant for t in mine.tenants] == ["acme"]  # its own row only
    (row,) = mine.tenants
    assert (row.running, row.queued) == (1, 1)
    everyone = await locked_client.fleet()  # the default tenant's client sees every tenant
    assert "acme" in {t.tenant for t in everyone.tenants} and everyone.capacity == 1
    for run_id in (running, queued):
        assert (await acme.wait(run_id, timeout=bound(60))).status == "completed"
    assert (await acme.state(queued)).waited_s > 1.0  # type: ignore[union-attr]
