"""The one way a pydantic validation error is told to a person: each bad field by its path,
``criteria[0].name`` style (the README's), with what is wrong with it."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError


def loc_path(loc: tuple[Any, ...] | list[Any], empty: str = "(message)") -> str:
    """``("criteria", 0, "name")`` -> ``criteria[0].name``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or empty


def problems(err: ValidationError, empty: str = "(message)") -> list[str]:
    """One ``path: what is wrong`` line per error."""
    return [f"{loc_path(tuple(e['loc']), empty)}: {e['msg']}" for e in err.errors()]


def describe(err: ValidationError, limit: int = 8) -> str:
    """A pydantic error in one line naming each bad field by path."""
    lines = problems(err)
    more = len(lines) - limit
    return "; ".join(lines[:limit]) + (f"; and {more} more" if more > 0 else "")
