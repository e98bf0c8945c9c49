"""One message applied to a run: the decision a transaction makes over the stored run state. No I/O.

The handler loads the run, asks ``apply_message``, saves the result under compare-and-swap (a
conflict reloads and asks again), publishes what it returned, and takes the run's next model turn
when the message scheduled one (``Applied.scheduled``): the transaction returns that turn, it
never takes it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from services.planner import stalls
from services.planner.outbox import Outbox
from services.planner.state import PublishRecord, RunState
from shared.messages import RunAdvance

Change = Callable[[RunState], Outbox | None]
"""What a message does to the run (one ``apply_*`` of a phase module); None: nothing (stale)."""


@dataclass
class Applied:
    state: RunState
    items: list[PublishRecord]  # what the message produced (applied before: what is left of it to publish)
    was_done: bool  # the run had ended before it (or it was applied before): nothing to count or finish
    changed: bool = True  # False: applied before; the state is as stored, its outbox is published again

    def scheduled(self) -> tuple[list[PublishRecord], RunAdvance | None]:
        """What to publish when the run's next turn is taken where the message is handled, and that
        turn (None: the message scheduled none). Its advance stays in the message's outbox in the
        record, so a redelivery of the message takes the turn again from there."""
        return scheduled_turn(self.items)


def scheduled_turn(items: list[PublishRecord]) -> tuple[list[PublishRecord], RunAdvance | None]:
    """``items`` without the advance to the run's own next turn, and that advance (None: none)."""
    for k, item in enumerate(items):
        turn = item.own_advance()
        if turn is not None:
            return items[:k] + items[k + 1 :], turn
    return items, None


def apply_message(state: RunState, msg_id: str, change: Change) -> Applied | None:
    """``msg_id`` applied to ``state`` once: a message applied before gives back its outbox unchanged (a
    redelivery re-publishes, never re-applies; downstream de-duplicates by message id)."""
    if state.seen(msg_id):
        return Applied(state, state.outbox.get(msg_id, []), was_done=True, changed=False)
    was_done = state.done
    stall = state.stall
    out = change(state)
    if out is None:
        return None
    stalls.moved(state, out, stall)  # the run moved: a stall on a missing replica ends, an ended run's too
    state.remember(msg_id, out.items)
    return Applied(state, out.items, was_done)
