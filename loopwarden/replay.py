"""Replay an exported run offline through the current code, and say where it diverges.

The export becomes a scenario (``shared.records.scenario_from_record``): the recorded model turns are
replayed by the scripted provider, so a run recorded with the anthropic provider needs no key; the
recorded tool attempts and raw outputs are scripted tool behaviour; the recorded verdicts are the
judge's replies. The replay is an ordinary run on the stack; its Decide rows, validation results and
budget actions are compared with the recorded ones, and its outcome with the recorded outcome.

An incident becomes a test: ``loopwarden replay incident.json --save scenarios/incident-x.yaml``
writes the scenario (with the recorded outcome as ``expect``), which the suite then runs like every
file in ``scenarios/``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from loopwarden.client import Client
from loopwarden.records import run_events
from shared.records import EventRecord, RunRecord, Step, divergences, scenario_from_record, trajectory
from shared.scenario import parse_scenario


@dataclass
class ReplayReport:
    recorded_run: str
    replay_run: str
    status: str
    recorded_status: str
    recorded: list[Step] = field(default_factory=list)
    replayed: list[Step] = field(default_factory=list)
    divergences: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)

    @property
    def same(self) -> bool:
        return not self.divergences and not self.mismatches

    def lines(self) -> list[str]:
        out = [
            f"replayed {self.recorded_run} as {self.replay_run}: {self.status} (recorded: {self.recorded_status})",
            f"  decisions compared: {len(self.recorded)} recorded, {len(self.replayed)} replayed "
            f"(Decide rows, validation results, budget actions)",
        ]
        if self.same:
            out.append("  no divergence: the current code decided as the recorded run did")
        out += [f"  DIVERGES {d}" for d in self.divergences]
        out += [f"  OUTCOME {m}" for m in self.mismatches]
        return out


def load_record(path: str | Path) -> RunRecord:
    return RunRecord.model_validate_json(Path(path).read_bytes())


def scenario_yaml(record: RunRecord, name: str | None = None) -> str:
    data: dict[str, Any] = scenario_from_record(record, name)
    parse_scenario(data)  # what is written must load
    header = (
        "# yaml-language-server: $schema=../schemas/scenario.json\n"  # editors validate it (scenarios/ beside schemas/)
        f"# Replay of run {record.run_id} (loopwarden export, {record.provider} provider).\n"
    )
    return header + yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=110)


async def settled_events(client: Client, run_id: str, status: str, wait_s: float = 10.0) -> list[EventRecord]:
    """The run's events once its final event is stored (events follow the state they come from)."""
    deadline = time.monotonic() + wait_s
    while True:
        events, _ = await run_events(client.bus, run_id)
        if any(e.kind == f"run.{status}" for e in events) or time.monotonic() > deadline:
            return events
        await asyncio.sleep(0.1)


async def replay(client: Client, record: RunRecord, timeout: float = 120.0) -> ReplayReport:
    scenario = parse_scenario(scenario_from_record(record), f"export of {record.run_id}")
    state, mismatches = await client.run_and_check(scenario, timeout=timeout)
    events = await settled_events(client, state.run_id, state.status)
    recorded, replayed = trajectory(record.events), trajectory(events)
    return ReplayReport(
        recorded_run=record.run_id,
        replay_run=state.run_id,
        status=state.status,
        recorded_status=record.status,
        recorded=recorded,
        replayed=replayed,
        divergences=divergences(recorded, replayed),
        mismatches=mismatches,
    )
