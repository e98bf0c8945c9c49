"""Replay an exported run offline through the current code, and say where it diverges.

The export becomes a scenario (``shared.records.scenario_from_record``): the recorded model turns are
replayed by the scripted provider, so a run recorded with the anthropic provider needs no key; the
recorded tool attempts and raw outputs are scripted tool behaviour; the recorded verdicts are the
judge's replies. The replay is an ordinary run on the stack; its Decide rows, validation results and
budget actions are compared with the recorded ones, and its outcome with the recorded outcome.

A replay is a dry run: no tool runs for real. An export is a file anyone may have written (a colleague's,
a bug report's), so a call it holds no recorded output for is refused before anything is submitted
(:func:`unrecorded_calls`), and every tool it names gets a last scripted behaviour that fails visibly
instead of running (:data:`NOT_RUN`), should the replay ask a tool for more than was recorded.
``--allow-live-tools`` lifts both.

An incident becomes a test: ``loopwarden replay incident.json --save scenarios/incident-x.yaml``
writes the scenario (with the recorded outcome as ``expect``), which the suite then runs like every
file in ``scenarios/``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from loopwarden.client import Client, PermissionDenied, TenantSource, new_run_id
from loopwarden.record_sources import Direct
from shared.failures import NEVER_RAN
from shared.messages import RETRIED_FAILURES
from shared.records import TERMINAL, EventRecord, RunRecord, Step, divergences, scenario_from_record, trajectory
from shared.scenario import Scenario, parse_scenario
from shared.subjects import DEFAULT_TENANT

log = logging.getLogger("loopwarden.replay")


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


NOT_RUN = (
    "replay: no recorded output for this attempt, so the real tool was not run "
    "(`loopwarden replay --allow-live-tools` runs it)"
)


PLANNER_TOOLS = ("delegate",)  # answered by the planner itself (a sub-agent run): no tool runs


class LiveToolsRefused(Exception):
    """The export has calls without a recorded output: replaying it would run real tools."""

    def __init__(self, calls: list[str]) -> None:
        super().__init__(
            f"replay is a dry run, but {len(calls)} call(s) in this export have no recorded output and would run "
            f"the real tool: {'; '.join(calls[:5])}{' ...' if len(calls) > 5 else ''}; "
            "`--allow-live-tools` runs them"
        )
        self.calls = calls


def unrecorded_calls(record: RunRecord) -> list[str]:
    """The calls a replay of ``record`` would hand to a real tool: one the model made with no recorded tool
    call behind it, an attempt that succeeded with no recorded output, and a call whose last recorded
    attempt failed in a way that is retried or falls back (the next attempt has nothing scripted)."""
    found: list[str] = []
    recorded: dict[str, int] = {}
    for tc in record.tool_calls:
        if ".fb." not in tc.attempt_id:
            recorded[tc.tool] = recorded.get(tc.tool, 0) + 1
        attempts = sorted(tc.attempts, key=lambda a: a.attempt)
        if any(a.ok for a in attempts) and not tc.has_output:
            found.append(f"{tc.tool} (call {tc.call_id}): succeeded, output not recorded")
        elif attempts and not attempts[-1].ok and attempts[-1].failure_type in RETRIED_FAILURES:
            found.append(f"{tc.tool} (call {tc.call_id}): last recorded attempt {attempts[-1].failure_type}")
        elif not attempts and (tc.outcome or {}).get("failure_type") not in NEVER_RAN:
            found.append(f"{tc.tool} (call {tc.call_id}): no attempt recorded")
    made: dict[str, int] = {}
    for call in sorted(record.model_calls, key=lambda c: c.n):
        if call.purpose != "plan":
            continue
        for tc in call.response.get("tool_calls") or []:
            name = str(tc.get("name", "?"))
            made[name] = made.get(name, 0) + 1
            if made[name] > recorded.get(name, 0) and name not in PLANNER_TOOLS:
                found.append(f"{name} (turn {call.n}, call {tc.get('id')}): no recorded tool call")
    return found


def dry_scenario(record: RunRecord, name: str | None = None) -> dict[str, Any]:
    """The replay scenario with, for every tool the export names, a last behaviour that fails visibly
    (:data:`NOT_RUN`) instead of running the tool: what the recording does not cover never runs."""
    data: dict[str, Any] = scenario_from_record(record, name)
    names = {tc.tool for tc in record.tool_calls}
    for call in record.model_calls:
        names.update(str(tc.get("name")) for tc in call.response.get("tool_calls") or [] if tc.get("name"))
    for tool in sorted(names):
        data["tools"].setdefault(tool, []).append({"fail": "fatal", "error": NOT_RUN, "times": "always"})
    return data


def load_record(path: str | Path) -> RunRecord:
    return RunRecord.model_validate_json(Path(path).read_bytes())


def scenario_yaml(record: RunRecord, name: str | None = None, allow_live_tools: bool = False) -> str:
    data: dict[str, Any] = scenario_from_record(record, name) if allow_live_tools else dry_scenario(record, name)
    parse_scenario(data)  # what is written must load
    header = (
        "# yaml-language-server: $schema=../schemas/scenario.json\n"  # editors validate it (scenarios/ beside schemas/)
        f"# Replay of run {record.run_id} (loopwarden export, {record.provider} provider).\n"
    )
    return header + yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=110)


async def settled_events(client: Client, run_id: str, status: str, wait_s: float = 10.0) -> list[EventRecord]:
    """The run's events once its final event is stored (events follow the state they come from)."""
    deadline = time.monotonic() + wait_s
    source = TenantSource(client) if client.tenant_bound else Direct(client.bus)
    while True:
        events, _ = await source.events(run_id)
        kind = "run.escalated" if status == "awaiting_human" else f"run.{status}"
        if any(e.kind == kind for e in events) or time.monotonic() > deadline:
            return events
        await asyncio.sleep(0.1)


def replay_scenario(record: RunRecord, allow_live_tools: bool = False) -> Scenario:
    """The scenario a replay of ``record`` runs: a dry run unless ``allow_live_tools`` (:class:`LiveToolsRefused`
    when the export holds calls with no recorded output). The same for the CLI and the console's Replay button."""
    if not allow_live_tools and (calls := unrecorded_calls(record)):
        raise LiveToolsRefused(calls)
    data = scenario_from_record(record) if allow_live_tools else dry_scenario(record)
    return parse_scenario(data, f"export of {record.run_id}")


def recorded_tenant(record: RunRecord) -> str:
    """The tenant the recorded run was of: a replay of it is charged to that tenant's day."""
    tenant = record.config.get("tenant") or (record.state or {}).get("tenant")
    return str(tenant) if tenant else DEFAULT_TENANT


async def start_replay(client: Client, record: RunRecord, scenario: Scenario) -> str:
    """Submit the replay: on the operators' replay subject (``S.run_replay``), which the planner takes whatever
    ``LW_ALLOW_SCRIPTED`` says, charged to the recorded run's tenant. A client of a tenant - or any user the
    server refuses that subject - submits it as a scripted run of its own tenant instead, which needs scripted
    runs allowed (``LW_ALLOW_SCRIPTED``, a staging stack)."""
    if not client.tenant_bound:
        try:
            return await client.submit_replay(scenario, recorded_tenant(record), new_run_id())
        except PermissionDenied:
            log.info("replay: %s may not use the replay subject; a scripted run instead", client.identity)
    return await client.submit_scenario(scenario, accepted=False)  # a refusal is the replay's report


def compare(
    record: RunRecord, replay_run: str, status: str, events: list[EventRecord], mismatches: list[str]
) -> ReplayReport:
    """The replay's decisions and outcome against the recorded run's."""
    recorded, replayed = trajectory(record.events), trajectory(events)
    return ReplayReport(
        recorded_run=record.run_id,
        replay_run=replay_run,
        status=status,
        recorded_status=record.status,
        recorded=recorded,
        replayed=replayed,
        divergences=divergences(recorded, replayed),
        mismatches=mismatches,
    )


async def replay(
    client: Client, record: RunRecord, timeout: float = 120.0, allow_live_tools: bool = False
) -> ReplayReport:
    """Replay ``record`` on the stack; a dry run unless ``allow_live_tools`` (:class:`LiveToolsRefused`)."""
    scenario = replay_scenario(record, allow_live_tools)
    run_id = await start_replay(client, record, scenario)
    # a person's answer is not played back: a replay of a run a person resolved stops where the person was
    # a replay the planner refused (scripted runs off) ends at once with the reason (``refused``)
    state = await client.wait(run_id, timeout=timeout, until=(*TERMINAL, "refused", "awaiting_human"))
    if state.status == "refused":
        mismatches = [f"the replay was refused: {state.final_reason}"]
    else:
        mismatches = await client.check(scenario, state)
    events = await settled_events(client, state.run_id, state.status)
    return compare(record, state.run_id, state.status, events, mismatches)
