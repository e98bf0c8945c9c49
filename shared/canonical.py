"""Canonical identity of a tool call: same tool and same arguments, whatever the key order.

Used by loop detection (identical calls) and by the last-good-result cache (``use_cached``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from shared.subjects import kv_key


def call_signature(tool: str, arguments: dict[str, Any]) -> str:
    canonical = json.dumps([tool, arguments], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def cache_key(tool: str, arguments: dict[str, Any]) -> str:
    return kv_key(tool, call_signature(tool, arguments))
