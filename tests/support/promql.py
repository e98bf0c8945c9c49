"""Reading PromQL in tests: which metrics a query names."""

from __future__ import annotations

import re


def metric_names(promql: str) -> set[str]:
    """The metric names a query reads (ours and the GenAI conventions'; label names and values left out)."""
    bare = re.sub(r"\{[^}]*\}", "", promql)
    bare = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", bare)
    return set(re.findall(r"\b((?:loopwarden|gen_ai)_[a-zA-Z_]+)\b", bare))


def base_name(series: str) -> str:
    """A histogram's family name from one of its series (``x_bucket``, ``x_sum``, ``x_count`` -> ``x``)."""
    return re.sub(r"_(bucket|sum|count)$", "", series)
