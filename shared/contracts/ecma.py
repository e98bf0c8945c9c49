"""Regular expressions as JSON Schema defines them: ECMA-262, not Python ``re``.

``pattern``, ``patternProperties`` and the ``regex`` format are ECMA-262 regular expressions,
compiled with the ``u`` flag as the specification recommends (``\\p{Letter}``, named groups
``(?<name>...)``). A pattern the ``u`` flag refuses only for Annex B leniencies (``\\-`` outside a
class, a lone ``]``) is compiled without it, as browsers and jsonschema-rs do, unless it uses
syntax that means something else without ``u`` (``\\p{...}``, ``\\u{...}``).

The explaining engine (python-jsonschema) matches with ``regress``, an ECMA-262 engine; the
fast engine (jsonschema-rs) translates ECMA-262 to Rust regexes. A pattern is accepted
only when both compile it, and on the one construct where their matching is known to
differ (``\\b``/``\\B``: Rust's word boundary is Unicode-aware, ECMA-262's is ASCII-only) the
pattern is refused with a way around it, so the two engines never disagree in silence.
"""

from __future__ import annotations

from functools import lru_cache

import jsonschema_rs
import regress

_U_ONLY_ESCAPES = frozenset("pPu")  # \p{..}, \P{..}, \u{..} change meaning without the u flag


def _escapes(pattern: str) -> list[tuple[str, bool]]:
    """Each escaped character of ``pattern`` and whether it sits inside a character class."""
    out: list[tuple[str, bool]] = []
    in_class = False
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            out.append((pattern[i + 1], in_class))
            i += 2
            continue
        if c == "[" and not in_class:
            in_class = True
        elif c == "]" and in_class:
            in_class = False
        i += 1
    return out


@lru_cache(maxsize=4096)
def _compile(pattern: str) -> regress.Regex | str:
    """The compiled pattern, or why it is not an ECMA-262 regular expression."""
    try:
        return regress.Regex(pattern, "u")
    except regress.RegressError as err:
        strict_error = str(err)
    if any(e in _U_ONLY_ESCAPES for e, _ in _escapes(pattern)):
        return strict_error
    try:
        return regress.Regex(pattern)
    except regress.RegressError:
        return strict_error


def is_regex(pattern: str) -> bool:
    """Whether ``pattern`` is an ECMA-262 regular expression (the ``regex`` format)."""
    return not isinstance(_compile(pattern), str)


def search(pattern: str, text: str) -> bool:
    """ECMA-262 ``RegExp.prototype.test``: does ``pattern`` match anywhere in ``text``?"""
    compiled = _compile(pattern)
    if isinstance(compiled, str):
        raise ValueError(f"pattern {pattern!r} is not an ECMA-262 regular expression: {compiled}")
    return compiled.find(text) is not None


@lru_cache(maxsize=4096)
def pattern_problem(pattern: str) -> str | None:
    """Why ``pattern`` cannot be used in a contract, or None."""
    compiled = _compile(pattern)
    if isinstance(compiled, str):
        return f"pattern {pattern!r} is not a valid ECMA-262 regular expression: {compiled}"
    try:
        jsonschema_rs.validator_for({"pattern": pattern})
    except Exception:
        return f"pattern {pattern!r} is not supported by the validation engine (jsonschema-rs); simplify it"
    if any(e in "bB" and not in_class for e, in_class in _escapes(pattern)):
        return (
            f"pattern {pattern!r} uses a word boundary (\\b or \\B), which the two validation engines "
            "read differently for non-ASCII letters; spell it with lookarounds, e.g. (?<![A-Za-z0-9_])"
        )
    return None
