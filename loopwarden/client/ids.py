"""The message ids the client publishes under: a run is submitted once per run id, however often the
client retries the publish (a reconnect, a replay asked twice)."""

from __future__ import annotations


def submit_id(run_id: str) -> str:
    return f"submit.{run_id}"
