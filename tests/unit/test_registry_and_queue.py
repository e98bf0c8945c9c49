"""Boundaries per tool or group, and the escalation queue's rules."""

from __future__ import annotations

import pytest

from services.escalation import queue as Q
from services.executor.registry import ToolRegistry
from shared.messages import EscalationRaise, EscalationResolve, ToolContract
from shared.settings import Settings
from shared.tools import ToolContext


async def noop(args: dict, ctx: ToolContext) -> dict:  # type: ignore[type-arg]
    return {}


def contract(name: str, **kw: object) -> ToolContract:
    return ToolContract.model_validate(
        {
            "name": name,
            "description": f"{name} for tests",
            "inputSchema": {"type": "object"},
            "outputSchema": {"type": "object"},
            **kw,
        }
    )


def test_boundary_comes_from_the_tool_then_its_name_then_its_group() -> None:
    settings = Settings(boundaries={"weather": "use_cached", "enrichment": "skip_and_note"})
    registry = ToolRegistry(boundaries=dict(settings.boundaries))
    registry.register(contract("weather", group="enrichment"), noop)
    registry.register(contract("geo", group="enrichment"), noop)
    registry.register(contract("pay", group="enrichment", boundary="ask_human"), noop)
    registry.register(contract("plain"), noop)
    assert {n: t.contract.boundary for n, t in registry.tools.items()} == {
        "weather": "use_cached",
        "geo": "skip_and_note",
        "pay": "ask_human",
        "plain": None,
    }


def test_a_bad_boundary_setting_names_the_setting() -> None:
    from pydantic import ValidationError

    from shared.settings import describe_settings_error

    with pytest.raises(ValidationError) as err:
        Settings(boundaries={"x": "retry_forever"})
    assert "invalid setting LW_BOUNDARIES" in describe_settings_error(err.value)


ITEM = Q.raise_item(EscalationRaise(escalation_id="e1", run_id="r", kind="fatal", reason="boom"), None)


def test_a_claim_is_exclusive_and_a_resolution_final() -> None:
    claimed = Q.claim(ITEM, "ana")
    assert claimed.status == "claimed" and Q.claim(claimed, "ana").claimed_by == "ana"  # idempotent for its owner
    with pytest.raises(Q.QueueError, match="claimed by ana"):
        Q.claim(claimed, "bo")
    with pytest.raises(Q.QueueError, match="only they can resolve it"):
        Q.resolve(claimed, EscalationResolve(escalation_id="e1", who="bo", action="resume"))
    resolved, resolution = Q.resolve(
        claimed, EscalationResolve(escalation_id="e1", who="ana", action="abort", note="no")
    )
    assert resolved.status == "resolved" and resolution.action == "abort" and resolution.resolved_by == "ana"
    with pytest.raises(Q.QueueError, match="already resolved"):
        Q.resolve(resolved, EscalationResolve(escalation_id="e1", who="ana", action="resume"))
    with pytest.raises(Q.QueueError, match="already resolved"):
        Q.claim(resolved, "ana")


def test_accept_is_only_for_unjudged_candidates() -> None:
    with pytest.raises(Q.QueueError, match="'accept' applies to a candidate"):
        Q.resolve(ITEM, EscalationResolve(escalation_id="e1", who="ana", action="accept"))
    unjudged = ITEM.model_copy(update={"kind": "not_judged"})
    assert (
        Q.resolve(unjudged, EscalationResolve(escalation_id="e1", who="ana", action="accept"))[0].status == "resolved"
    )
