"""A run's whole record (``export``, what ``loopwarden export``, ``show`` and ``replay`` read), and a replay's
submit on the operators' replay subject (``submit_replay``).

Who reads every run (an operator, the console, the default tenant's client, the admin) reads the record
directly (``loopwarden.records``, its archive once the records expired); a client bound to a tenant asks the
planner for each part of its own run (``rpc.runs.<state|events|values>.<tenant>``, ``Tenant`` below), and
another tenant's run is not found, as a missing one."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from loopwarden import records as R
from loopwarden.client.ids import submit_id
from loopwarden.client.reads import Reads
from loopwarden.client.refusals import guarded
from loopwarden.client.runs import scenario_submit
from loopwarden.record_sources import event_record, key_ok, trace_id_of
from shared import subjects as S
from shared.messages import RunRead
from shared.records import EventRecord, RunRecord
from shared.scenario import Scenario


@dataclass
class TenantSource:
    """A run's record as the planner answers a client of the run's tenant (``R.RunSource``)."""

    client: Reads

    async def _values(self, bucket: str, run_id: str, key: str | None = None) -> list[tuple[str, dict[str, Any]]]:
        out: list[tuple[str, dict[str, Any]]] = []
        start: int | None = 0
        while start is not None:
            reply = await self.client._read("values", RunRead(run_id=run_id, bucket=bucket, key=key, start=start))
            for item in reply.items:
                value = json.loads(await self.client._value(item.body))
                out.append((item.subject, value if isinstance(value, dict) else {"value": value}))
            start = reply.next
        return out

    async def value(self, bucket: str, key: str, run_id: str) -> dict[str, Any] | None:
        owned = bucket in (S.KV_VERDICTS, S.KV_ESCALATIONS)  # keyed by another id: the planner checks the run
        if owned and not key_ok(key):
            return None
        found = await self._values(bucket, run_id, key if owned else None)
        return found[0][1] if found else None

    async def prefixed(self, bucket: str, run_id: str) -> dict[str, dict[str, Any]]:
        return dict(await self._values(bucket, run_id))

    async def events(self, run_id: str) -> tuple[list[EventRecord], str | None]:
        out: list[EventRecord] = []
        trace_id: str | None = None
        for e in await self.client._run_events_read(run_id, f"{S.P}.evt.>"):
            out.append(event_record(e.subject, e.seq, e.time, json.dumps(e.payload).encode()))
            trace_id = trace_id or trace_id_of(e.headers)
        return out, trace_id


class Exports(Reads):
    """A run's whole record, and replays."""

    @guarded
    async def export(self, run_id: str) -> RunRecord:
        """Everything ``run_id`` left (``RunRecord``, the file ``loopwarden replay`` takes), or
        ``RecordNotFound``. A client bound to a tenant reads its own runs only (another's is not found); the
        others read any run, and one whose records expired from the archive (``LW_ARCHIVE_DIR``/``_BUCKET``)."""
        if self.tenant_bound:
            return await R.collect(TenantSource(self), run_id)
        return await R.export_run(self.bus, self.settings, run_id)

    @guarded
    async def submit_replay(self, scenario: Scenario, tenant: str | None, run_id: str) -> str:
        """Submit a replay's scenario on the operators' replay subject (``S.run_replay``): the planner takes it
        whatever ``LW_ALLOW_SCRIPTED`` says, and ``tenant`` (the replayed run's) pays. Only operators, the
        console and the admin may publish there (``PermissionDenied`` for anyone else)."""
        submit = scenario_submit(scenario, run_id)
        await self.bus.publish(S.run_replay(tenant), submit, msg_id=submit_id(run_id))
        return run_id
