"""Handled messages removed from a stream by their number, in the background, best effort (``Removals``), and the
commands a run's planner published, removed once the run ended and each was handled (``SentCommands``).

The planner removes a client's submit from ``LW_SUBMIT`` once it is handled for good (``Intake.take``): nothing
reads it again (its run's record holds what the run needs, a refusal is a record and a dead letter with its own
copy, a redelivery finds the record) and its message id stays in the stream's de-duplication window. Left, it
stayed until the retention sweep purged what every durable had handled (about 4 KB per demo run).

The commands the planner publishes for a run (its advances, tool calls and judge requests: ``LW_CMD``) are handled
once their outcome is applied to the run (``ids.handled_by``); nothing reads them again either (a tool call's
arguments and result are in its outcome event and the executor's ledger, a judge request's candidate in the run's
events and verdict). When the run ends, the replica that published them removes those it knows handled: about
3.7 KB of a demo run. The others (a command whose outcome never came, one another replica published, the
executor's results for the validator) stay until the retention sweep.

A removal that fails - the server refuses it (a planner of this release under the last release's grants, which
lack ``$JS.API.STREAM.MSG.DELETE``: nats-server drops the request, so it times out) or does not answer - leaves
the message to the sweep, says so once in the log, and the next ones are not tried for ``PAUSE_S``: a refused
right costs one timeout a minute, not one per submit. A message already gone is no failure.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence

from services.planner import ids
from shared.bus import Bus
from shared.bus.wire import _PubAck

log = logging.getLogger("loopwarden.planner")

PAUSE_S = 60.0


class Removals:
    def __init__(self, bus: Bus, stream: str, what: str) -> None:
        self.bus, self.stream, self.what = bus, stream, what
        self.paused_until = 0.0  # monotonic time before which nothing is tried (after a failure)
        self.failures = 0
        self._tasks: set[asyncio.Task[None]] = set()

    def remove(self, seq: int) -> None:
        """Remove message ``seq`` in the background (0: not a stored message, e.g. a dead letter handed back)."""
        if seq <= 0 or time.monotonic() < self.paused_until:
            return
        task = asyncio.create_task(self._remove(seq))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def idle(self) -> None:
        """Until every removal started is done (tests, and a stopping planner)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _remove(self, seq: int) -> None:
        try:
            await self.bus.remove(self.stream, seq)
        except Exception as err:
            if "no message found" in str(err).lower():  # gone already: removed, or purged by the sweep
                return
            self.failures += 1
            self.paused_until = time.monotonic() + PAUSE_S
            log.warning(
                "planner: could not remove a handled %s from %s (%s); it stays until the retention sweep, "
                "and the next are not tried for %.0f s",
                self.what,
                self.stream,
                type(err).__name__ if not str(err) else err,
                PAUSE_S,
            )


class SentCommands:
    """The numbers of the commands this replica published per run, until the run ends (at most ``runs`` runs:
    the oldest are forgotten, their commands left to the sweep)."""

    def __init__(self, runs: int = 20_000) -> None:
        self.runs = runs
        self._sent: OrderedDict[str, dict[str, int]] = OrderedDict()

    def published(self, run_id: str, msg_ids: Sequence[str | None], acks: Sequence[_PubAck]) -> None:
        known = self._sent.get(run_id)
        for msg_id, ack in zip(msg_ids, acks, strict=True):
            if msg_id and ack.seq and ids.handled_by(run_id, msg_id):
                if known is None:
                    known = self._sent[run_id] = {}
                known[msg_id] = ack.seq
        while len(self._sent) > self.runs:
            self._sent.popitem(last=False)

    def ended(self, run_id: str, applied: Sequence[str]) -> list[int]:
        """The numbers of the run's commands handled for good (their proof is among ``applied``); the run is
        forgotten."""
        done = set(applied)
        sent = self._sent.pop(run_id, {})
        return [seq for msg_id, seq in sent.items() if any(p in done for p in ids.handled_by(run_id, msg_id))]
