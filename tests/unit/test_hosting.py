"""Which called tools a running replica hosts (services/planner/hosting.py), with the lookup scripted."""

from __future__ import annotations

import asyncio

from services.planner.hosting import Hosting


def scripted(answers: dict[str, list[bool | None]]) -> tuple[Hosting, list[str]]:
    asked: list[str] = []

    async def probe(tool: str) -> bool | None:
        asked.append(tool)
        return answers[tool].pop(0)

    return Hosting(probe, recheck_s=0), asked


async def test_a_tool_nobody_pulls_twice_in_a_row_is_unhosted() -> None:
    hosting, _ = scripted({"gone": [False, False], "back": [False, True], "busy": [True]})
    assert await hosting.unhosted(["gone", "back", "busy"]) == {"gone"}


async def test_when_the_server_cannot_say_the_tool_counts_as_hosted() -> None:
    hosting, _ = scripted({"t": [None]})
    assert await hosting.unhosted(["t"]) == set()


async def test_a_tool_seen_hosted_is_not_asked_again_at_once_and_an_unhosted_one_always_is() -> None:
    hosting, asked = scripted({"up": [True], "gone": [False, False, False, False]})
    await hosting.unhosted(["up", "gone"])
    await hosting.unhosted(["up", "gone", "up"])
    assert asked == ["gone", "gone", "up", "gone", "gone"]


async def test_a_replica_back_within_the_grace_keeps_its_tool_hosted() -> None:
    """An executor restarting (a crash, a rolling upgrade) pulls again within ``LW_TOOL_HOST_GRACE_S``: its
    calls wait in the stream as they always did, instead of failing as ``unknown_tool``."""
    answers = [False, False, False, False, True]

    async def probe(tool: str) -> bool | None:
        return answers.pop(0)

    hosting = Hosting(probe, recheck_s=0.01, grace_s=5)
    assert await hosting.unhosted(["restarting"]) == set()
    assert not answers


async def test_a_tool_still_unhosted_after_the_grace_is_unhosted() -> None:
    asked: list[str] = []

    async def probe(tool: str) -> bool | None:
        asked.append(tool)
        return False

    hosting = Hosting(probe, recheck_s=0.01, grace_s=0.1)
    assert await hosting.unhosted(["gone"]) == {"gone"}
    assert len(asked) >= 3


async def test_a_tool_seen_hosted_is_asked_again_in_the_background_and_a_gone_one_is_asked_inline() -> None:
    """Past half its TTL a hosted tool's next call is dispatched at once while the lookup runs beside it;
    a lookup that finds nobody pulling makes the call after it ask first (and find it unhosted)."""
    answers = [True, False, False, False]
    asked = asyncio.Event()

    async def probe(tool: str) -> bool | None:
        asked.set()
        return answers.pop(0)

    hosting = Hosting(probe, ttl_s=0.2, recheck_s=0)
    assert await hosting.unhosted(["t"]) == set() and len(answers) == 3
    await asyncio.sleep(0.12)  # past half the TTL
    asked.clear()
    assert await hosting.unhosted(["t"]) == set()  # served from what was seen, not waited for
    assert not asked.is_set() and len(answers) == 3
    await asyncio.sleep(0.01)  # the background lookup ran: nobody pulls
    assert asked.is_set() and len(answers) == 2
    assert await hosting.unhosted(["t"]) == {"t"}  # asked before dispatch, twice (the grace's recheck)
    assert answers == []
