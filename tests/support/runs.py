"""What several end-to-end test modules build scenarios from and read runs with."""

from __future__ import annotations

from typing import Any

from services.planner.state import RunState

GOOD_SEARCH = {
    "status": "success",
    "totalCount": 1,
    "results": [{"title": "JetStream de-duplication", "url": "https://docs.nats.io/x", "snippet": "Nats-Msg-Id ..."}],
}


def tool_results(state: RunState) -> list[Any]:
    """Every tool_result block the model was shown, in order."""
    return [b for m in state.messages if m.role == "user" for b in m.content if b.type == "tool_result"]


def submit(answer: str) -> dict[str, Any]:
    """A scripted model turn that submits ``answer`` through the terminal tool."""
    return {"tool_calls": [{"name": "submit_result", "input": {"answer": answer}}]}
