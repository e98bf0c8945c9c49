"""This replica's hold on ledger entries: taking a call the ledger already holds (``reclaim``) and the
owner lease, renewed while the call runs, that keeps other replicas from taking it for abandoned."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime, timedelta
from typing import Any, assert_never

from opentelemetry.trace import Span

from services.executor.finishing import Finisher
from services.executor.ledger import LedgerEntry, claim, lease_live, on_delivery, renewed
from shared import subjects as S
from shared import telemetry as T
from shared.bus import Bus, CasConflict, TryLater
from shared.messages import ToolCall, utcnow
from shared.settings import Settings

log = logging.getLogger("loopwarden.executor")


class Ownership:
    """Ledger entries as this replica (``replica``) owns them; a call ended here goes to ``finisher``."""

    def __init__(self, bus: Bus, settings: Settings, replica: str, finisher: Finisher) -> None:
        self.bus, self.settings, self.replica, self.finisher = bus, settings, replica, finisher
        # attempt id -> (ledger revision, when this replica first saw it): how long an entry whose owner's
        # lease lapsed has stayed as it is, seen from here (``ledger.on_delivery``).
        self._seen: dict[str, tuple[int, float]] = {}

    async def reclaim(self, call: ToolCall, idempotent: bool, span: Span) -> tuple[LedgerEntry, int] | None:
        """The ledger already holds this call (a redelivery, or a racing delivery's claim): republish its
        recorded final, fail it as an unknown outcome, or claim it again (CAS) to run an idempotent tool
        once more. The claimed entry and its revision, or None when the call is finished here."""
        entry, revision = await self.bus.kv_get(S.KV_TOOL_LEDGER, call.attempt_id, LedgerEntry)
        lease_s = self.settings.tool_lease_s
        unchanged_s = self.unchanged_for(call.attempt_id, revision)
        decision = on_delivery(entry, utcnow(), unchanged_s, lease_s)
        if decision != "wait":
            self._seen.pop(call.attempt_id, None)
        match decision:
            case "wait":
                assert entry is not None
                alive = lease_live(entry, utcnow())
                if alive:
                    assert entry.lease_until is not None
                    delay, why = (entry.lease_until - utcnow()).total_seconds(), "is running it"
                else:
                    delay, why = lease_s - unchanged_s, "let its lease lapse (cut off, or gone?)"
                # Held while its owner renews the lease, however long the call runs: waiting on a live
                # replica spends none of this message's deliveries (it is not a crash).
                raise TryLater(
                    f"ledger entry {call.attempt_id}: {entry.owner or 'an earlier delivery'} {why}",
                    delay=min(max(delay, 0.2), lease_s),
                    while_alive=alive,
                )
            case "republish":
                assert entry is not None
                await self.finisher.deliver(call, entry, revision)
                return None
            case "unknown_outcome":
                assert entry is not None
                span.set_attribute(T.LW_FAILURE_TYPE, "unknown_outcome")
                await self.finisher.finish_failure(
                    call,
                    entry,
                    revision,
                    "unknown_outcome",
                    "a previous delivery started it but no result was recorded",
                    attempts=entry.runs,
                )
                return None
            case "run":
                pass
            case _:
                assert_never(decision)
        entry = claim(entry, call.attempt_id, call.tool, idempotent, **self.lease())
        try:
            revision = await self.finisher.save(entry, revision)
        except CasConflict as err:  # another executor claimed it a moment ago: decide again
            raise TryLater(f"ledger entry {call.attempt_id} changed while claiming it", delay=0.5) from err
        return entry, revision

    def lease(self) -> dict[str, Any]:
        """This replica's claim: it owns the entry, for a lease from now."""
        return {"owner": self.replica, "lease_until": renewed_at(self.settings.tool_lease_s)}

    def unchanged_for(self, attempt_id: str, revision: int) -> float:
        """Seconds this replica has seen ``attempt_id``'s ledger entry at ``revision``."""
        now = time.monotonic()
        seen = self._seen.get(attempt_id)
        if seen is None or seen[0] != revision:
            if len(self._seen) >= 10_000:  # decided elsewhere long ago: forget the oldest
                self._seen.pop(next(iter(self._seen)))
            self._seen[attempt_id] = (revision, now)
            return 0.0
        return now - seen[1]

    async def keep_lease(self, entry: LedgerEntry, revision: int) -> None:
        """Renew this replica's lease on a claimed entry while its call runs (cancelled when it ends), so no
        other replica takes the call for abandoned. It stops when the entry is no longer this replica's."""
        lease_s = self.settings.tool_lease_s
        while True:
            await asyncio.sleep(lease_s / 5)
            try:
                revision = await self.finisher.save(renewed(entry, utcnow(), lease_s), revision)
            except CasConflict:
                stored, revision = await self.bus.kv_get(S.KV_TOOL_LEDGER, entry.attempt_id, LedgerEntry)
                if stored is None or stored.final is not None or stored.owner != self.replica:
                    return
                entry = stored
            except Exception as err:  # the bus is down: renewed once it is back (the lease covers the gap)
                log.warning("executor: lease on %s not renewed: %r", entry.attempt_id, err)


def renewed_at(lease_s: float) -> datetime:
    return utcnow() + timedelta(seconds=lease_s)
