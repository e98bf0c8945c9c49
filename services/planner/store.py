"""Where the planner keeps its runs: the record in ``lw_runs`` (fixed size, CAS per step) and the
conversation in ``lw_history`` (append-only, ``shared/history.py``).

A replica keeps what it last stored or read per run (messages of one run are handled one at a time
in a replica), so a step reads nothing first: it applies to the kept state and tries its CAS on
the kept revision; a conflict (another replica moved the run) reads the record again, and only
the messages this replica has not seen yet. Before a save drops the previous tail from the record,
that tail is in ``lw_history`` (written right after the save that carried it, together with the
step's publishes; written again here when this replica cannot tell, which is harmless: the same
bytes under the same key).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

from services.planner.state import RunState
from shared import history
from shared import subjects as S
from shared.bus import Bus, CasConflict, Unchanged
from shared.messages import ChatMessage

R = TypeVar("R")


class RunStore:
    SIZE = 256  # runs whose state a replica keeps in memory

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self._states: OrderedDict[str, tuple[RunState, int]] = OrderedDict()
        # per run: (seq of messages[0], seq after the last stored one, the list): a re-read reuses it
        self._seen: OrderedDict[str, tuple[int, int, list[ChatMessage]]] = OrderedDict()

    def keep(self, state: RunState, revision: int, *, cold: bool = False) -> None:
        """Keep ``state`` as the run's (``cold``: first in line to be dropped, so it takes no room from a run in
        flight: a queued run, whose next step is its start, maybe on another replica, seconds or hours away)."""
        run_id = state.run_id
        self._states[run_id] = (state, revision)
        self._states.move_to_end(run_id, last=not cold)
        self._seen[run_id] = (state.history_start, state.history_len, state.messages)
        self._seen.move_to_end(run_id, last=not cold)
        while len(self._states) > self.SIZE:
            self._states.popitem(last=False)
        while len(self._seen) > self.SIZE:
            self._seen.popitem(last=False)

    def revision(self, state: RunState) -> int | None:
        """The revision ``state`` was kept at, if it is still what this replica keeps for its run."""
        kept = self._states.get(state.run_id)
        return kept[1] if kept is not None and kept[0] is state else None

    def kept(self, run_id: str) -> tuple[RunState, int] | None:
        """The run's state and revision as this replica last stored or read them (None: not held)."""
        return self._states.get(run_id)

    async def save(self, state: RunState, revision: int) -> int:
        """Store ``state`` over ``revision`` (compare-and-swap; ``CasConflict`` when the record moved on)."""
        if not state.tail_stored:  # this save drops the tail the record carries: it must be stored first
            await self.store_tail(state)
        state.seal()
        # a running run's record is replaced at its next step (the bucket keeps the last): stored lean only at rest
        lean = state.status != "running"
        revision = await self.bus.kv_put(S.KV_RUNS, state.run_id, state, revision=revision, lean=lean)
        self.keep(state, revision)
        return revision

    def forget(self, run_id: str) -> None:
        """The kept state was changed outside a transaction: the next one reads the record again."""
        self._states.pop(run_id, None)

    async def load(self, run_id: str, fresh: bool = False) -> RunState | None:
        if not fresh and run_id in self._states:
            return self._states[run_id][0]
        state, _ = await self.read(run_id)
        return state

    async def read(self, run_id: str) -> tuple[RunState | None, int]:
        """The stored record with its live history, and its revision (0 when absent)."""
        state, revision = await self.bus.kv_get(S.KV_RUNS, run_id, RunState)
        if state is None:
            return None, revision
        start, end = state.history_start, state.tail_from
        have: list[ChatMessage] = []
        seen = self._seen.get(run_id)
        if seen is not None and seen[0] == start:
            have = seen[2][: max(0, min(seen[1], end) - start)]
        rest = await history.read(self.bus, run_id, start + len(have), end)
        state.loaded([*have, *rest, *state.tail], tail_stored=False)
        self.keep(state, revision)
        return state, revision

    async def create(self, state: RunState) -> int:
        """Store a new run (CAS on absent; ``CasConflict`` if it exists); a queued one is kept ``cold``."""
        state.seal()
        revision = await self.bus.kv_put(S.KV_RUNS, state.run_id, state, revision=0)
        self.keep(state, revision, cold=state.status == "queued")
        return revision

    async def update(self, run_id: str, change: Callable[[RunState | None], tuple[RunState, R] | Unchanged[R]]) -> R:
        """Read-modify-write under compare-and-swap, starting from the kept state (``Bus.update``'s
        contract: ``change`` may be called again on a fresh read after a conflict)."""
        for _ in range(20):
            known = self._states.pop(run_id, None)
            state, revision = known if known is not None else await self.read(run_id)
            outcome = change(state)
            if isinstance(outcome, Unchanged):
                if known is not None:  # "nothing to do" is only trusted on what is really stored
                    continue
                if state is not None:
                    self.keep(state, revision)
                return outcome.result
            new, result = outcome
            try:
                await self.save(new, revision)
            except CasConflict:
                continue
            return result
        raise CasConflict(f"{S.KV_RUNS}/{run_id}: still contended after 20 attempts")

    async def store_tail(self, state: RunState) -> None:
        """Write the record's tail to ``lw_history`` (after the save that carried it)."""
        if not state.tail_stored:
            await history.write(self.bus, state.run_id, state.tail_from, state.tail)
            state.tail_is_stored()
