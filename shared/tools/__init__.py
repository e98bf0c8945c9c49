"""The tool author's API, below every service: the executor imports it, never the reverse.

``from loopwarden import tool, ToolContext, ToolFailure, ToolState`` lands here (``authoring.py``); a
typed tool's contract comes from its signature (``signatures.py``).
"""

from shared.tools.authoring import (
    ATTRIBUTE,
    STATE_BUCKET,
    BucketOpener,
    Declared,
    PostHook,
    ToolContext,
    ToolFailure,
    ToolFn,
    ToolState,
    declaration_of,
    declared_in,
    tool,
    typed_runner,
)
from shared.tools.signatures import Signature, SignatureError, signature_of, to_json_value

__all__ = [
    "ATTRIBUTE",
    "STATE_BUCKET",
    "BucketOpener",
    "Declared",
    "PostHook",
    "Signature",
    "SignatureError",
    "ToolContext",
    "ToolFailure",
    "ToolFn",
    "ToolState",
    "declaration_of",
    "declared_in",
    "signature_of",
    "to_json_value",
    "tool",
    "typed_runner",
]
