"""Tools: what an executor hosts, MCP servers it mounts, large bodies by reference, and test-only faults."""

from __future__ import annotations

import json
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

NotJudgedPolicy = Literal["escalate", "retry", "accept", "fail"]
LoopPolicy = Literal["stop", "escalate"]
FaultPoint = Literal[
    "after_start_recorded",
    "after_side_effect",
    "after_final_recorded",
    "after_final_published",
    "after_run_saved",  # the planner: a run's record is saved, nothing of it published or appended yet
    "after_model_answered",  # the planner: a turn's new model answer is stored, the run's record not yet saved
]


class McpServerSpec(BaseModel):
    """One MCP server the executor mounts over stdio (an item of ``LW_MCP_SERVERS``)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9_-]+$")
    command: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    tools: list[str] | None = Field(None, description="mount only these tools")
    prefix: str = Field("", description="prefix for the mounted tool names")
    output_schemas: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="outputSchema for tools whose server declares none (their text is then parsed as JSON); "
        "without one, a tool's content reaches the model as text",
    )
    repairs: dict[str, list[dict[str, str]]] = Field(default_factory=dict)
    timeout_s: float = Field(10.0, gt=0)
    # --- added for issue 14 (services/executor/mcp_tools.py) ---------------------------------
    start_timeout_s: float = Field(30.0, gt=0, description="spawn + handshake + tool list, per server")
    restart_base_s: float = Field(0.5, ge=0, description="first restart delay of a dead server; doubles")
    restart_max_s: float = Field(30.0, gt=0, description="longest delay between restarts")
    closed_output_schemas: bool = Field(
        False,
        description="close the server's declared outputSchemas (additionalProperties: false); the default "
        "keeps them as written, so a server that adds an output field keeps working",
    )
    idempotent: dict[str, bool] = Field(
        default_factory=dict, description="tool -> idempotent, overriding the server's annotations"
    )
    max_result_chars: int = Field(100_000, ge=100, description="a longer text result is cut (with a note)")


class ToolSettings(BaseModel):
    # --- executor --------------------------------------------------------------------
    executor_tools: str = Field("*", description="comma list of tools this executor hosts, '*' for all")
    tool_contract_dir: str | None = Field(None, description="extra directory of JSON tool contracts")
    tool_modules: str | None = Field(
        None, description="comma list of Python tool modules (@tool) to import: installed dotted names or .py paths"
    )
    default_schema_dialect: Literal["draft-07", "2019-09", "2020-12"] = "2020-12"
    mcp_servers: str | None = Field(None, description="JSON list of MCP stdio servers to mount")
    boundaries: dict[str, Literal["skip_and_note", "use_cached", "ask_human"]] = Field(
        default_factory=dict,
        description='JSON: tool or group name -> error boundary, e.g. {"enrichment": "skip_and_note"}',
    )

    # --- large payloads and fault injection (issue 9) ----------------------------------
    payload_inline_limit_bytes: int = Field(
        256 * 1024,
        ge=1024,
        description="a message body or KV value larger than this travels by reference (JetStream Object Store); "
        "capped below the server's max_payload",
    )
    payload_max_bytes: int = Field(
        8 * 1024**3,
        ge=1024 * 1024,
        description="the claim-check stream LW_PAYLOADS holds at most this many bytes (a new body is refused "
        "when it is full)",
    )
    tool_output_max_bytes: int = Field(
        16 * 1024 * 1024, ge=1024, description="a tool output above this is a failure the model sees, never retried"
    )
    run_state_result_max_bytes: int = Field(
        16 * 1024, ge=256, description="the planner keeps at most this much of one tool result in its run state"
    )
    fault_inject: FaultPoint | None = Field(
        None,
        description="TEST ONLY: the executor exits (os._exit) at this point of every tool call (the planner: "
        "after_run_saved, after saving a run's record; after_model_answered, after storing a turn's new model "
        "answer, before saving the record); unset in production",
    )

    @field_validator("mcp_servers")
    @classmethod
    def _mcp_servers(cls, v: str | None) -> str | None:
        if v:
            try:
                data = json.loads(v)
            except json.JSONDecodeError as err:
                raise ValueError(f"not JSON: {err.msg} at column {err.colno}") from None
            if not isinstance(data, list):
                raise ValueError("must be a JSON list of servers")
            for i, item in enumerate(data):
                try:
                    McpServerSpec.model_validate(item)
                except ValidationError as err:
                    first = err.errors()[0]
                    where = ".".join(str(p) for p in first["loc"])
                    raise ValueError(f"server #{i}: {where}: {first['msg']}") from None
            names = [item["name"] for item in data]
            if len(set(names)) != len(names):  # a server's status and events are keyed by its name
                raise ValueError(
                    f"server names must be unique; repeated: {sorted({n for n in names if names.count(n) > 1})}"
                )
        return v

    @field_validator("executor_tools")
    @classmethod
    def _tools_list(cls, v: str) -> str:
        names = [t.strip() for t in v.split(",") if t.strip()]
        if not names:
            raise ValueError("must name at least one tool, or '*'")
        return v

    @cached_property
    def hosted_tools(self) -> frozenset[str] | None:
        """Tools this executor hosts; ``None`` means every registered tool."""
        names = {t.strip() for t in self.executor_tools.split(",") if t.strip()}
        return None if "*" in names else frozenset(names)

    @property
    def mcp_server_specs(self) -> list[McpServerSpec]:
        return [McpServerSpec.model_validate(x) for x in json.loads(self.mcp_servers)] if self.mcp_servers else []
