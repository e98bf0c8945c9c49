"""Waiting for a run to reach a status, woken by the run's own events instead of polling."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, get_args

from loopwarden.client.door import refusal_error
from loopwarden.client.queue import Queue
from loopwarden.client.reads import TENANT_POLL_S
from loopwarden.client.refusals import guarded
from shared import subjects as S
from shared.messages import (
    FINAL_STATUSES,
    FINISHED_STATUSES,
    PROGRESS_EVENTS,
    ChatMessage,
    Refusal,
    RunSnapshot,
    RunStatus,
)

PROGRESS_STEMS = frozenset(S.run_event(e.model_fields["kind"].default) for e in PROGRESS_EVENTS)
_FINAL_STEMS = {S.run_event(status): status for status in FINAL_STATUSES}
ACCEPTED: tuple[str, ...] = tuple(s for s in get_args(RunStatus) if s != "refused")  # a planner took it in


class Waiting(Queue):  # (a Queue reads runs too: the last turns it shows with an item)
    """``wait`` and what it needs: a subscription to the run's events shared by the waits on it."""

    @guarded
    async def wait(
        self,
        run_id: str,
        timeout: float = 60.0,
        until: tuple[str, ...] = FINISHED_STATUSES,
        history: bool = True,
    ) -> RunSnapshot:
        """The run's snapshot once its status is in ``until`` (with its ``messages`` unless
        ``history`` is false). A run refused at the door raises ``Refused`` (``QuotaExceeded`` for a
        quota) at once, unless ``until`` names ``refused``. Reacts to the run's own events (a subscription
        to that run's subjects, shared by waits on it) instead of polling; the state is read again only when one of the
        run's events that can change its status arrives (not on a step's progress events, see
        ``PROGRESS_EVENTS``), and once a second as a safety net. A run that waits for a human is
        returned once its queue item is there (``show(state.awaiting.escalation_id)`` has it)."""
        deadline = time.monotonic() + timeout
        changed = await self._on_run_events(run_id)
        poll = TENANT_POLL_S if self.tenant_bound else 1.0  # a tenant-bound client has no live events: it asks
        state = None
        try:
            while time.monotonic() < deadline:
                changed.clear()
                try:
                    state, stored = await self._state_and_final(run_id)
                except TimeoutError:  # the server did not answer in time (an overloaded machine): ask again
                    continue
                if state is not None and state.status == "refused" and "refused" not in until:
                    raise refusal_error(run_id, state.refusal or Refusal(reason=state.final_reason or "refused"))
                if state is not None and state.status in until:
                    if state.done and stored != state.status:
                        await self._settled(run_id, state.status, deadline, changed)
                    elif state.awaiting is not None:
                        await self._filed(run_id, state.awaiting.escalation_id, deadline)
                    if history:
                        state.messages = await self._history_by(state, deadline)
                    return state
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0.01, min(poll, deadline - time.monotonic()))):
                        await changed.wait()
        finally:
            await self._stop_waiting(run_id, changed)
        raise TimeoutError(
            f"run {run_id} did not reach {until} in {timeout:.0f}s (last status: "
            f"{state.status if state else 'not stored'})"
        )

    async def _state_and_final(self, run_id: str) -> tuple[RunSnapshot | None, str | None]:
        """The run's state and, once the run's own final event was relayed live to this client, whether the
        stream stores it, read together: (state, that status if found stored). A live event is not yet a
        stored one (the stream may take it a moment after it is relayed), so it is read, but beside the
        state, not after it: the planner publishes the final event only after it saved the final state, so
        the state read with it is final too. Without a final event seen, the state alone (``None``)."""
        final = self._finals_seen.get(run_id)
        if final is None:
            return await self.state(run_id), None
        state, found = await asyncio.gather(
            self.state(run_id), self.events(run_id, subjects=S.run_event(final), timeout=0.2)
        )
        return state, final if found else None

    async def _history_by(self, state: RunSnapshot, deadline: float) -> list[ChatMessage]:
        """The run's messages, asked again while the server does not answer in time (a stream electing a new
        leader after a node died) until the wait's deadline."""
        while True:
            try:
                return await self.history(state)
            except TimeoutError:
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(0.2)

    async def _on_run_events(self, run_id: str) -> asyncio.Event:
        """An event set whenever one of the run's events is published: the server sends this
        client that run's ``evt.run.*`` events only (``S.run_filters``), not every run's."""
        changed = asyncio.Event()
        self._waiters.setdefault(run_id, set()).add(changed)
        if run_id not in self._run_events and not self.tenant_bound:  # its user reads no live event
            subs = self._run_events[run_id] = []

            async def dispatch(msg: Any) -> None:
                stem = msg.subject.rsplit(".", 1)[0]
                if stem in PROGRESS_STEMS:
                    return  # a step's progress: the status is unchanged, nothing to read again
                if stem in _FINAL_STEMS:
                    self._finals_seen[run_id] = _FINAL_STEMS[stem]
                for waiter in self._waiters.get(run_id, ()):
                    waiter.set()

            for subject in S.run_filters(run_id, f"{S.RUN_EVENT_PREFIX}.>"):
                subs.append(await self.bus.nc.subscribe(subject, cb=dispatch))
        return changed

    async def _stop_waiting(self, run_id: str, changed: asyncio.Event) -> None:
        waiters = self._waiters.get(run_id)
        if waiters is None:
            return
        waiters.discard(changed)
        if not waiters:
            del self._waiters[run_id]
            self._finals_seen.pop(run_id, None)
            for sub in self._run_events.pop(run_id, []):
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()

    async def _filed(self, run_id: str, escalation_id: str, deadline: float) -> None:
        """Wait until the queue has the item a waiting run names: the escalation service files it a moment
        after the planner's state says the run waits, and whoever was told "waits for a human" looks it up next
        (an operator, told by the run's client). A client bound to a tenant, which does not read the queue, waits
        for the run's own event saying the item was filed (``escalation.raised``)."""
        from nats.errors import NoRespondersError

        while self.tenant_bound and time.monotonic() < deadline:
            raised = await self.events(run_id, subjects=S.ESCALATION_RAISED, timeout=0.2)
            if any(e.payload.get("escalation_id") == escalation_id for e in raised):
                return
            await asyncio.sleep(TENANT_POLL_S)
        while not self.tenant_bound and time.monotonic() < deadline:
            try:
                if (await self.show(escalation_id)).ok:
                    return
            except NoRespondersError:
                return  # no queue to ask (a stack run without the escalation service): nothing to wait for
            await asyncio.sleep(0.05)

    async def _settled(self, run_id: str, status: str, deadline: float, changed: asyncio.Event) -> None:
        """Wait until the run's final event is in the stream. The planner saves the state, then
        publishes; the final event is published last, so once it is there, the history is whole."""
        while time.monotonic() < deadline:
            if await self.events(run_id, subjects=S.run_event(status), timeout=0.2):
                return
            changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.2):
                    await changed.wait()
