"""Running a scenario to its end and comparing the run with what the scenario expects."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from loopwarden.client.events import tool_outcomes
from loopwarden.client.runs import Runs
from shared import subjects as S
from shared.messages import (
    FINISHED_STATUSES,
    Escalation,
    EscalationResolution,
    RunLimits,
    RunSnapshot,
)
from shared.scenario import Outcome, Scenario


class Scenarios(Runs):
    """A scenario's run and its check against ``expect``."""

    async def run_scenario(
        self, scenario: Scenario, *, timeout: float = 120.0, limits: RunLimits | None = None
    ) -> RunSnapshot:
        """Submit ``scenario`` and wait until the run ends or waits for a human (``awaiting_human``: see
        ``escalations``), at most ``timeout`` seconds (else ``TimeoutError`` naming the run). The snapshot
        has its ``run_id``, ``status``, ``final_output``, ``final_reason``, ``usage`` and ``messages``; a run
        waiting for a human has ``awaiting.escalation_id``, an item already in the queue (``show`` has it)."""
        run_id = await self.submit_scenario(scenario, limits=limits)
        return await self.wait(run_id, timeout=timeout, until=(*FINISHED_STATUSES, "awaiting_human"))

    async def run_and_check(self, scenario: Scenario, timeout: float = 120.0) -> tuple[RunSnapshot, list[str]]:
        """Run a scenario to its end (or to a human, if that is what it expects) and compare with ``expect``."""
        run_id = await self.submit_scenario(scenario)
        expect = scenario.expect
        ended: tuple[str, ...] = FINISHED_STATUSES
        until = (*ended, "awaiting_human") if expect is not None and expect.status == "awaiting_human" else ended
        state = await self.wait(run_id, timeout=timeout, until=until)
        return state, await self.check(scenario, state)

    async def _items_of(self, run_id: str) -> list[Escalation]:
        """The run's queue items: asked of the queue, or - by a client bound to a tenant, which does not read
        the queue (it holds every tenant's arguments) - from its run's own escalation events."""
        if not self.tenant_bound:
            return (await self.escalations(status="all", run_id=run_id)).escalations
        items: dict[str, Escalation] = {}
        for e in await self.events(run_id, subjects=f"{S.ESCALATION_EVENT_PREFIX}.>"):
            with contextlib.suppress(ValueError):
                if e.kind.startswith("escalation.raised"):
                    item = Escalation.model_validate(e.payload)
                    items.setdefault(item.escalation_id, item)
                elif e.kind.startswith("escalation.resolved"):
                    resolution = EscalationResolution.model_validate(e.payload)
                    if resolution.escalation_id in items:
                        items[resolution.escalation_id].resolution = resolution
        return list(items.values())

    async def check(self, scenario: Scenario, state: RunSnapshot) -> list[str]:
        """How the run in ``state`` differs from what ``scenario.expect`` says, one line each (none: as expected,
        or no ``expect``)."""
        expect = scenario.expect
        if expect is None:
            return []
        run_id = state.run_id
        escalations: list[Any] = []
        deadline = time.monotonic() + 10
        while True:  # queue items are created by the escalation service a moment after the state says so
            escalations = await self._items_of(run_id)
            if expect.escalations is None or len(escalations) >= expect.escalations or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.05)
        # every call's final outcome, from the run's events (read again for up to 2 s while a stated count
        # differs: the planner publishes a call's last events with the state that ends the run)
        outcomes = tool_outcomes(await self.events(run_id))
        late = time.monotonic() + 2
        while expect.tool_mismatches(outcomes) and time.monotonic() < late:
            await asyncio.sleep(0.1)
            outcomes = tool_outcomes(await self.events(run_id))
        return expect.mismatches(
            Outcome(
                status=state.status,
                final_output=state.final_output,
                escalations=len(escalations),
                escalation_kinds=[e.kind for e in escalations],
                passed=state.passed,
                first_draft_passed=state.first_draft_passed,
                submitted=state.submitted,
                model_calls=state.model_calls,
                judge_calls=state.judge_seq,
                retries=state.retry_count,
                continues=state.continue_count,
                tool_outcomes=outcomes,
                escalation_actions=[e.resolution.action for e in escalations if e.resolution is not None],
            )
        )
