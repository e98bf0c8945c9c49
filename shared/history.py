"""A run's conversation, kept beside its record: ``lw_history``, one key per message.

The planner's record of a run (``lw_runs``, the ``RunSnapshot`` contract) is rewritten with
compare-and-swap at every step, so it must not grow with the run. The messages are appended to
``lw_history`` under ``<run>.<seq>`` instead: each seq is written once, with the content a stored
record already carries in its ``tail`` (so a repeated write is the same bytes, and two writers
never disagree), and never changed; compaction starts the live history at a later seq. A reader
takes messages ``history_start .. tail_from - 1`` from the bucket and the rest from the record's
``tail``, so what the record names is always readable, whether or not its tail was written yet.
"""

from __future__ import annotations

import asyncio

from shared import subjects as S
from shared.bus import Bus
from shared.messages import ChatMessage, RunSnapshot

READ_BATCH = 64  # gets in flight at once when a whole history is read


class HistoryMissing(RuntimeError):
    """A message the record names is not in ``lw_history`` (it was removed, or never written)."""


def key(run_id: str, seq: int) -> str:
    return S.kv_key(run_id, str(seq))


async def read(bus: Bus, run_id: str, start: int, end: int) -> list[ChatMessage]:
    """Messages ``start .. end - 1`` of the run, from the bucket (gets in flight together)."""
    out: list[ChatMessage] = []
    for lo in range(start, end, READ_BATCH):
        seqs = range(lo, min(end, lo + READ_BATCH))
        got = await asyncio.gather(*(bus.kv_get(S.KV_HISTORY, key(run_id, seq), ChatMessage) for seq in seqs))
        for seq, (message, _) in zip(seqs, got, strict=True):
            if message is None:
                raise HistoryMissing(f"{S.KV_HISTORY}/{key(run_id, seq)} is missing")
            out.append(message)
    return out


async def messages(bus: Bus, snap: RunSnapshot, last: int | None = None) -> list[ChatMessage]:
    """The run's live conversation as ``snap`` names it (or only its ``last`` messages)."""
    start = snap.history_start if last is None else max(snap.history_start, snap.history_len - last)
    stored = await read(bus, snap.run_id, start, max(start, snap.tail_from))
    tail = snap.tail[max(0, start - snap.tail_from) :]
    return [*stored, *tail]


async def write(bus: Bus, run_id: str, first: int, items: list[ChatMessage]) -> None:
    """Store messages ``first ..`` (a record's tail), acks awaited together."""
    if items:  # sent at once (one write with what the caller sends beside them: a step's outbox), acks together
        await bus.kv_put_all(S.KV_HISTORY, [(key(run_id, first + i), m) for i, m in enumerate(items)])
