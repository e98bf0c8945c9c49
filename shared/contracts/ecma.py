"""Regular expressions as JSON Schema defines them: ECMA-262, not Python ``re``.

``pattern``, ``patternProperties`` and the ``regex`` format are ECMA-262 regular expressions,
compiled with the ``u`` flag as the specification recommends (``\\p{Letter}``, named groups
``(?<name>...)``). A pattern the ``u`` flag refuses only for Annex B leniencies (``\\-`` outside a
class, a lone ``]``) is compiled without it, as browsers and jsonschema-rs do, unless it uses
syntax that means something else without ``u`` (``\\p{...}``, ``\\u{...}``).

Whether a pattern is ECMA-262 is decided by ``regress``, an ECMA-262 engine (registration and
the ``regex`` format). Matching is done by jsonschema-rs, which translates ECMA-262 to Rust
regexes, but not everywhere: inside lookarounds its ``\\d``, ``\\w``, ``\\s`` and ``.`` are
Unicode-aware, and its ``\\b`` always is. So it is given each pattern with those spelled out as
the explicit sets ECMA-262 defines (:func:`for_rust`), in both engines (python-jsonschema's
pattern keywords call :func:`search`), and a pattern is accepted only when both compile it.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import jsonschema_rs
import regress

from shared.contracts.walk import children

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
    """Whether ``pattern`` is an ECMA-262 regular expression (the ``regex`` format).

    Values come from tool outputs, so they are compiled each time, not kept in the pattern cache
    (which holds only what schemas declare); compiling never backtracks.
    """
    return not isinstance(_compile.__wrapped__(pattern), str)


def search(pattern: str, text: str) -> bool:
    """ECMA-262 ``RegExp.prototype.test``: does ``pattern`` match anywhere in ``text``?

    Matching runs on the fast engine's automaton (the pattern as :func:`for_rust` spells it), not
    on regress: regress backtracks, so a pattern like ``(a*)*b`` takes minutes (or all memory) on
    a short hostile string, while jsonschema-rs matches in linear time wherever it can. Both
    engines thus answer from one matcher, and tests/unit/test_contract_spec.py holds that matcher
    to regress's ECMA-262 answers.
    """
    return bool(_matcher(pattern).is_valid(text))


@lru_cache(maxsize=4096)
def _matcher(pattern: str) -> Any:
    if isinstance(_compile(pattern), str):
        raise ValueError(f"pattern {pattern!r} is not an ECMA-262 regular expression")
    return jsonschema_rs.validator_for({"pattern": for_rust(pattern)})


# ECMA-262 character classes, spelled so that any engine reads them the same way.
_WORD = "A-Za-z0-9_"
_SPACE = "\\t\\n\\x0B\\f\\r \\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000\\ufeff"
_LINE_END = "\\n\\r\\u2028\\u2029"
_OUTSIDE = {
    "d": "[0-9]",
    "D": "[^0-9]",
    "w": f"[{_WORD}]",
    "W": f"[^{_WORD}]",
    "s": f"[{_SPACE}]",
    "S": f"[^{_SPACE}]",
    "b": f"(?:(?<=[{_WORD}])(?![{_WORD}])|(?<![{_WORD}])(?=[{_WORD}]))",
    "B": f"(?:(?<=[{_WORD}])(?=[{_WORD}])|(?<![{_WORD}])(?![{_WORD}]))",
}
_INSIDE = {"d": "0-9", "w": _WORD, "s": _SPACE}


class Untranslatable(ValueError):
    pass


_NEGATED_INSIDE = {"D": "0-9", "W": _WORD, "S": _SPACE}


@lru_cache(maxsize=4096)
def for_rust(pattern: str) -> str:
    """``pattern`` with ECMA-262's shorthand classes, ``.`` and ``\\b`` spelled out for jsonschema-rs.

    jsonschema-rs reads ``\\d``, ``\\w``, ``\\s``, ``.`` and ``\\b`` as ECMA-262 only in some
    positions (not inside lookarounds, not ``\\b`` at all); spelled out as explicit sets they mean
    the same in both engines. A class holding a negated shorthand (``[\\s\\S]``) becomes an
    alternation; inside a negated class (``[^\\S]``) or as a range end it has no spelling.
    """
    out: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            e = pattern[i + 1]
            out.append(_OUTSIDE.get(e, pattern[i : i + 2]))
            i += 2
        elif c == "[":
            end = _class_end(pattern, i)
            out.append(_class_for_rust(pattern[i:end]))
            i = end
        elif c == ".":
            out.append(f"[^{_LINE_END}]")
            i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _class_end(pattern: str, start: int) -> int:
    """The index just after the class that opens at ``start`` (ECMA-262: a ``]`` right away closes it)."""
    j = start + 1
    if pattern.startswith("^", j):
        j += 1
    while j < len(pattern):
        if pattern[j] == "\\":
            j += 2
        elif pattern[j] == "]":
            return j + 1
        else:
            j += 1
    return len(pattern)


def _class_for_rust(cls: str) -> str:
    negated = cls.startswith("[^")
    body = cls[2:-1] if negated else cls[1:-1]
    kept: list[str] = []
    excluded: list[str] = []  # sets of negated shorthands: [\\S] is [^<space>]
    i = 0
    while i < len(body):
        if body[i] == "\\" and i + 1 < len(body):
            e = body[i + 1]
            if e in _INSIDE or e in _NEGATED_INSIDE:
                if (body[i + 2 : i + 3] == "-" and i + 3 < len(body)) or (i > 0 and body[i - 1] == "-"):
                    raise Untranslatable(f"\\{e} as the end of a range")
                if e in _INSIDE:
                    kept.append(_INSIDE[e])
                else:
                    excluded.append(_NEGATED_INSIDE[e])
            else:
                kept.append(body[i : i + 2])
            i += 2
        else:
            kept.append(body[i])
            i += 1
    inner = "".join(kept)
    if not excluded:
        return f"[^{inner}]" if negated else f"[{inner}]"
    if negated:
        raise Untranslatable(f"a negated shorthand inside a negated class ({cls})")
    return "(?:" + "|".join(([f"[{inner}]"] if inner else []) + [f"[^{x}]" for x in excluded]) + ")"


def rust_schema(node: Any) -> Any:
    """A copy of ``node`` whose ``pattern``s and ``patternProperties`` keys are :func:`for_rust`'s."""
    if not isinstance(node, dict):
        return node
    out = dict(node)
    for key, parts, sub in children(node):
        if len(parts) == 1:
            out[key] = rust_schema(sub)
            continue
        if out[key] is node[key]:
            out[key] = dict(node[key]) if isinstance(node[key], dict) else list(node[key])
        out[key][parts[1]] = rust_schema(sub)
    if isinstance(out.get("pattern"), str):
        out["pattern"] = for_rust(out["pattern"])
    if isinstance(out.get("patternProperties"), dict):
        out["patternProperties"] = {for_rust(k): v for k, v in out["patternProperties"].items()}
    return out


@lru_cache(maxsize=4096)
def pattern_problem(pattern: str) -> str | None:
    """Why ``pattern`` cannot be used in a contract, or None."""
    compiled = _compile(pattern)
    if isinstance(compiled, str):
        return f"pattern {pattern!r} is not a valid ECMA-262 regular expression: {compiled}"
    try:
        translated = for_rust(pattern)
    except Untranslatable as err:
        return f"pattern {pattern!r} uses {err}, which the two validation engines read differently; list the characters"
    try:
        jsonschema_rs.validator_for({"pattern": pattern})
        jsonschema_rs.validator_for({"pattern": translated})
    except Exception:
        return f"pattern {pattern!r} is not supported by the validation engine (jsonschema-rs); simplify it"
    return None
