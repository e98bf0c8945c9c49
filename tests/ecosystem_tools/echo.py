"""A tool that answers with the arguments it received: what a policy let through is visible to the test."""

from __future__ import annotations

from typing import Any


async def book(args: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return {"received": args}
