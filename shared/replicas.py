"""Which service replicas are alive, from the registry every replica heartbeats into (``lw_replicas``). Pure:
the records and the time are passed in. ``shared/service.py`` writes a replica's entry (``ReplicaRecord``) every
``LW_REPLICA_TTL_S`` / 3 and deletes it when the replica stops; the bucket's entries expire after
``LW_REPLICA_TTL_S`` (a killed replica's too), and a reader ignores an entry older than that anyway."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from shared import subjects as S
from shared.messages import ReplicaRecord


def replica_key(service: str, instance: str) -> str:
    """The replica's key: ``<service>.<instance>`` (each service's grant writes its own ``<service>.>`` only)."""
    return S.kv_key(service, instance)


def alive(records: Iterable[ReplicaRecord], now: datetime, ttl_s: float) -> list[ReplicaRecord]:
    """The replicas heard from within ``ttl_s`` of ``now``, by service and start time."""
    since = now - timedelta(seconds=ttl_s)
    return sorted((r for r in records if r.seen_at >= since), key=lambda r: (r.service, r.started_at, r.instance))


@dataclass(frozen=True)
class Fleet:
    """What the live replicas cover: the services with one, and the durables one of them pulls."""

    services: frozenset[str] = frozenset()
    durables: frozenset[str] = frozenset()
    replicas: tuple[ReplicaRecord, ...] = field(default=(), compare=False)

    @classmethod
    def of(cls, live: Iterable[ReplicaRecord]) -> Fleet:
        replicas = tuple(live)
        return cls(
            services=frozenset(r.service for r in replicas),
            durables=frozenset(d for r in replicas for d in r.durables),
            replicas=replicas,
        )

    def serves(self, service: str, durable: str | None = None) -> bool:
        """Whether a live replica of ``service`` is there (pulling ``durable``, when named)."""
        return durable in self.durables if durable is not None else service in self.services
