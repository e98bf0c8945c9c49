"""The replica registry's I/O (the rules are ``shared/replicas.py``): a running replica heartbeats its entry into
``lw_replicas``, and anyone allowed to read the bucket lists the live ones (``live_replicas``: the planner's
stall sweep, and the fleet view)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid

from pydantic import ValidationError

from shared import subjects as S
from shared.bus import Bus, kv_scan
from shared.messages import ReplicaRecord, utcnow
from shared.payloads import PayloadError
from shared.replicas import alive, replica_key
from shared.version import package_version

log = logging.getLogger("loopwarden.replicas")


async def live_replicas(bus: Bus) -> list[ReplicaRecord]:
    """Every replica heard from within ``LW_REPLICA_TTL_S``, by service (one batched read of the bucket); an
    entry that does not parse is left out and logged."""
    await bus.kv(S.KV_REPLICAS)  # created if missing (unmanaged), or waited for
    found, _ = await kv_scan(bus.nc, S.KV_REPLICAS)
    records = []
    for key, stored in found.items():
        if stored is None:
            continue
        try:
            value = await bus.payloads.inflate_value(bus.nc, stored.data, bus.settings.value_limit(S.KV_REPLICAS))
            records.append(ReplicaRecord.model_validate_json(value))
        except (ValidationError, PayloadError) as err:
            log.warning("lw_replicas/%s does not parse (left out): %s", key, err)
    return alive(records, utcnow(), bus.settings.replica_ttl_s)


class Registration:
    """This process's entry in ``lw_replicas``, rewritten every ``heartbeat_s`` while it runs, deleted at stop."""

    def __init__(self, bus: Bus, service: str) -> None:
        self.bus = bus
        now = utcnow()
        self.record = ReplicaRecord(
            service=service,
            instance=uuid.uuid4().hex[:16],
            version=package_version()[:64],
            host=f"{socket.gethostname()}:{os.getpid()}"[:256],
            started_at=now,
            seen_at=now,
        )
        self.key = replica_key(service, self.record.instance)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._beat(), name=f"heartbeat {self.key}")

    async def _beat(self) -> None:
        failing = False
        while True:
            try:  # the durables as of now: a tool mounted after start (an MCP server) is pulled too
                durables = sorted({spec.durable for spec in self.bus.consumer_specs})
                self.record = self.record.model_copy(update={"seen_at": utcnow(), "durables": durables})
                await self.bus.kv_put(S.KV_REPLICAS, self.key, self.record)
                failing = False
            except Exception as err:  # the bucket missing (bootstrap not run yet), NATS away: said once, tried on
                if not failing:
                    log.warning("%s: cannot write its entry in %s: %r", self.record.service, S.KV_REPLICAS, err)
                failing = True
            await asyncio.sleep(self.bus.settings.heartbeat_s)

    async def stop(self) -> None:
        """Stop beating and delete the entry: a replica that stopped is gone at once, not after the TTL."""
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        with contextlib.suppress(Exception):
            kv = await self.bus.kv(S.KV_REPLICAS)
            async with asyncio.timeout(2):
                await kv.delete(self.key)
