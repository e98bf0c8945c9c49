"""The channel table's subscriber column agrees with what the services' handlers really declare (read where
bootstrap and the AsyncAPI document read them: ``services.declared``, each service's ``build`` on a bus that
never connects)."""

from __future__ import annotations

import functools
import re

from loopwarden.generate import asyncapi
from shared.channels import CHANNELS


def overlaps(a: str, b: str) -> bool:
    """Whether some subject matches both NATS patterns (``{param}`` counts as ``*``)."""
    x, y = (re.sub(r"\{\w+\}", "*", p).split(".") for p in (a, b))
    for i, (p, q) in enumerate(zip(x, y, strict=False)):
        if ">" in (p, q):
            return True
        if p != q and "*" not in (p, q):
            return False
        if i == min(len(x), len(y)) - 1:
            return len(x) == len(y)
    return len(x) == len(y)


@functools.cache
def declared() -> dict[str, tuple[str, ...]]:
    return {s: tuple(subj for d in found for subj in d.subjects) for s, found in asyncapi.declared().services.items()}


def test_every_subscriber_in_the_table_consumes_or_answers_that_channel() -> None:
    wrong = [
        f"{c.address}: {service} declares nothing on it"
        for c in CHANNELS
        for service in c.subscribers
        if not any(overlaps(c.subject, s) for s in declared()[service])
    ]
    assert not wrong, "\n".join(wrong)


def test_every_durable_a_service_declares_reads_a_channel_naming_it() -> None:
    missing = [
        f"{d.service} {d.durable}: {subject}"
        for d in asyncapi.declared().all
        if d.durable
        for subject in d.subjects
        if not any(d.service in c.subscribers and overlaps(c.subject, subject) for c in CHANNELS)
    ]
    assert not missing, "consumed but no row names the consumer:\n" + "\n".join(missing)
