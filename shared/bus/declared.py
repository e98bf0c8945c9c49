"""What a service registered on its bus, read back: each durable it consumes and each subject it answers,
with the handler and the contract the bus decodes into. ``services/declared.py`` runs every service's
``build`` on a bus that never connects and reads this; bootstrap, the AsyncAPI generator, the grants and
the subscriber check all start from it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from shared.bus.connection import Bus
from shared.bus.infra import ConsumerSpec


@dataclass(frozen=True)
class Declaration:
    """One consuming declaration: a durable pull consumer (``consumer``), or a core NATS subject the service
    answers with a queue group (``consumer`` None; ``refusal`` the contract of its error reply)."""

    service: str
    handler: Callable[..., Awaitable[Any]]
    model: type[BaseModel]
    subjects: tuple[str, ...]
    consumer: ConsumerSpec | None = None
    refusal: type[BaseModel] | None = None

    @property
    def durable(self) -> str:
        return self.consumer.durable if self.consumer else ""


def declarations(bus: Bus) -> list[Declaration]:
    """What was registered on ``bus``, in registration order: its consumers, then its responders."""
    found = [Declaration(bus.service, p.handler, p.model, p.spec.filter_subjects, consumer=p.spec) for p in bus._pulls]
    for r in bus._responders:
        found.append(Declaration(bus.service, r.handler, r.model, (r.subject,), refusal=type(r.reply("reason"))))
    return found
