"""Tool definitions as the ecosystem writes them, read into our contract fields (pure).

A JSON contract file may hold a tool in any of three shapes; each becomes the same contract and
passes the same registration checks (``register_contract``):

* ours (and MCP's): ``{"name", "description", "inputSchema", "outputSchema", ...}``;
* OpenAI function format: ``{"type": "function", "function": {"name", "description", "parameters",
  "strict"?}, ...}``;
* Anthropic tool format: ``{"name", "description", "input_schema", ...}``.

Neither ecosystem format has an output schema: ``outputSchema`` may be given beside the tool (and
should: it is what the validator checks); without one, any JSON output is accepted. Our other
contract fields (``idempotent``, ``timeoutS``, ``repairs``, ...) may sit beside the tool in every
shape. ``undeclaredFields`` (refuse / strip / open) becomes the input schema's policy marker.
"""

from __future__ import annotations

from typing import Any, Literal

from shared.contracts.undeclared import FILE_KEY, POLICY_KEY

ToolFormat = Literal["loopwarden", "openai", "anthropic"]
ANY_OUTPUT: dict[str, Any] = {}  # no output schema given: any JSON value


class ToolFormatError(ValueError):
    """A tool definition that is none of the shapes we read, with what is wrong in one line."""


def tool_format(data: dict[str, Any]) -> ToolFormat:
    if data.get("type") == "function" or "function" in data:
        return "openai"
    if "input_schema" in data:
        return "anthropic"
    return "loopwarden"


def to_contract_fields(data: dict[str, Any]) -> tuple[ToolFormat, dict[str, Any]]:
    """The definition's format and its fields as ``ToolContract`` reads them (a new dict)."""
    out = dict(data)
    fmt = tool_format(out)
    if fmt == "openai":
        if out.pop("type", "function") != "function":
            raise ToolFormatError('an OpenAI tool definition has "type": "function"')
        fn = out.pop("function", None)
        if not isinstance(fn, dict):
            raise ToolFormatError('an OpenAI tool definition needs a "function" object (name, description, parameters)')
        unknown = sorted(set(fn) - {"name", "description", "parameters", "strict"})
        if unknown:
            raise ToolFormatError(f'unknown field(s) in "function": {", ".join(unknown)}')
        out["name"] = fn.get("name")
        out["description"] = fn.get("description") or fn.get("name")
        # an OpenAI function may omit parameters: it takes no arguments
        out["inputSchema"] = fn.get("parameters") or {"type": "object", "properties": {}}
    elif fmt == "anthropic":
        out["inputSchema"] = out.pop("input_schema")
        out.pop("cache_control", None)  # a request hint, not part of the tool
        out.pop("type", None)  # "custom" in newer Anthropic definitions
        out.setdefault("description", out.get("name"))
    if fmt != "loopwarden":
        out.setdefault("outputSchema", dict(ANY_OUTPUT))
    policy = out.pop(FILE_KEY, None)
    if policy is not None:
        schema = out.get("inputSchema")
        if isinstance(schema, dict):
            out["inputSchema"] = {**schema, POLICY_KEY: policy}
    return fmt, out
