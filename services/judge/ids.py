"""The message id the judge publishes under: one verdict per candidate, however often it is asked."""

from __future__ import annotations


def verdict(candidate_id: str) -> str:
    return f"verdict.{candidate_id}"
