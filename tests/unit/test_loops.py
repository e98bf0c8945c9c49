"""Loop detection: identical calls, A-B-A-B alternation, the same error again and again."""

from __future__ import annotations

from services.planner.loops import check_call, check_errors, error_key, signature


def test_identical_calls_alternation_and_repeated_errors() -> None:
    a, b = signature("search", {"q": "x", "n": 1}), signature("search", {"n": 1, "q": "x"})
    assert a == b  # canonical: key order does not matter
    hist = [("search", a), ("search", a)]
    assert check_call(hist, "search", a, window=6, threshold=3).kind == "identical"  # type: ignore[union-attr]
    assert check_call(hist[:1], "search", a, window=6, threshold=3) is None
    c = signature("calc", {"e": "1"})
    assert (
        check_call([("search", a), ("calc", c), ("search", a)], "calc", c, window=6, threshold=3).kind == "alternating"
    )  # type: ignore[union-attr]
    errs = [error_key("search", "HTTP 503 after 1.2s")] * 2 + [error_key("search", "HTTP 503 after 2.9s")]
    assert check_errors(errs, threshold=3).kind == "repeated_error"  # type: ignore[union-attr]
    assert check_errors(errs[:2], threshold=3) is None
