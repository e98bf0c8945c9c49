"""Handled messages removed from a stream by their number, in the background, best effort (``Removals``).

The planner removes a client's submit from ``LW_SUBMIT`` once it is handled for good (``Intake.take``): nothing
reads it again (its run's record holds what the run needs, a refusal is a record and a dead letter with its own
copy, a redelivery finds the record) and its message id stays in the stream's de-duplication window. Left, it
stayed until the retention sweep purged what every durable had handled (about 4 KB per demo run).

A removal that fails - the server refuses it (a planner of this release under the last release's grants, which
lack ``$JS.API.STREAM.MSG.DELETE``: nats-server drops the request, so it times out) or does not answer - leaves
the message to the sweep, says so once in the log, and the next ones are not tried for ``PAUSE_S``: a refused
right costs one timeout a minute, not one per submit. A message already gone is no failure.
"""

from __future__ import annotations

import asyncio
import logging
import time

from shared.bus import Bus

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
