"""Canonical identity of a JSON value: the same whatever the key order.

A tool call's signature (loop detection, the last-good-result cache for ``use_cached``), a
contract's fingerprint, and the digest a scripted run's scenario is bound by at submit.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from shared.subjects import kv_key


def digest_of(value: Any) -> str:
    """sha256 of a JSON value's canonical form (sorted keys, no spaces)."""
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def call_signature(tool: str, arguments: dict[str, Any]) -> str:
    return digest_of([tool, arguments])[:16]


def cache_key(tool: str, arguments: dict[str, Any]) -> str:
    return kv_key(tool, call_signature(tool, arguments))
