"""asyncio helpers every service shares (pure)."""

from __future__ import annotations

import asyncio
from typing import Any


def retrieved(fut: asyncio.Future[Any]) -> None:
    """A done callback for work nobody may await any more (a read ahead, a prefetch, a write left to finish): its
    failure is taken here, so asyncio does not log it as never retrieved. Whoever does await it still gets it."""
    if not fut.cancelled():
        fut.exception()
