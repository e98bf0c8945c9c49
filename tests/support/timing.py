"""One time scale for every bound a test waits on.

A busy machine (a CI runner, a laptop building something else) makes everything slower by about the
same factor, so every readiness wait, ``wait_for`` timeout, polling deadline and subprocess wait in the
suite is written as ``bound(seconds)``: the figure that holds on an idle machine, multiplied by
``LW_TEST_TIME_SCALE`` (default 1; e.g. 3 on a machine loaded to twice its core count). A bound that
expires says what it was waiting for (``eventually(..., what=...)``), so a timeout in a report can be
told from a wrong answer.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

SCALE_ENV = "LW_TEST_TIME_SCALE"


class BoundExpired(AssertionError):
    """A wait ran out: names what was awaited and for how long (and the scale it ran under)."""


def time_scale() -> float:
    """``LW_TEST_TIME_SCALE``: a number greater than 0 (below 1 shortens every wait)."""
    raw = os.environ.get(SCALE_ENV, "1")
    try:
        scale = float(raw)
    except ValueError:
        raise ValueError(f"{SCALE_ENV} must be a number (got {raw!r})") from None
    if scale <= 0:
        raise ValueError(f"{SCALE_ENV} must be greater than 0 (got {raw!r})")
    return scale


def bound(seconds: float) -> float:
    """``seconds`` as measured on an idle machine, scaled by ``LW_TEST_TIME_SCALE``."""
    return seconds * time_scale()


def polls(tries: int) -> int:
    """A polling loop's number of tries (``for _ in range(polls(100)): ... sleep(0.1)``), scaled by
    ``LW_TEST_TIME_SCALE`` like every other bound."""
    return max(tries, math.ceil(tries * time_scale()))


def expired(what: str, within: float, last: object = None) -> BoundExpired:
    seen = "" if last is None else f"; last seen: {last!r}"
    return BoundExpired(f"timed out after {within:g}s ({SCALE_ENV}={time_scale():g}) waiting for {what}{seen}")


async def eventually(predicate: Callable[[], T | Awaitable[T]], *, what: str, within: float, every: float = 0.05) -> T:
    """Poll ``predicate`` (plain or async) until it returns something truthy, and return that; after
    ``within`` seconds raise :class:`BoundExpired` naming ``what`` and the last value seen."""
    deadline = time.monotonic() + within
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise expired(what, within, value)
        await asyncio.sleep(every)


def eventually_sync(predicate: Callable[[], T], *, what: str, within: float, every: float = 0.05) -> T:
    """:func:`eventually` for code that is not async (subprocess tests, fixtures)."""
    deadline = time.monotonic() + within
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise expired(what, within, value)
        time.sleep(every)


async def within(awaitable: Awaitable[T], *, what: str, seconds: float) -> T:
    """``asyncio.wait_for`` whose timeout says what it was waiting for."""
    try:
        return await asyncio.wait_for(awaitable, seconds)
    except TimeoutError:
        raise expired(what, seconds) from None


def scale_test_timeout(config: Any) -> None:
    """pytest-timeout's per-test limit (``timeout`` in pyproject.toml) on the same scale, unless given on
    the command line or in ``PYTEST_TIMEOUT``."""
    if config.getoption("timeout", None) is not None or os.environ.get("PYTEST_TIMEOUT"):
        return
    ini = config.getini("timeout")
    if ini:
        config.option.timeout = bound(float(ini))
