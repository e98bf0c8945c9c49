"""Which called tools a running replica hosts (services/planner/hosting.py), with the lookup scripted."""

from __future__ import annotations

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
