"""The message id the governor publishes under: one budget event per run, turn and flag, so a reservation
asked again reports its warning or stop once."""

from __future__ import annotations


def budget_event(run_id: str, turn: int, flag: str) -> str:
    return f"{run_id}.budget.{turn}.{flag}"
