"""Generate ``schemas/messages/*.json`` from the wire models (``make schemas``).

The files are the reviewable contract: a change to a message shows up as a diff here, and
``tests/repo/test_contracts_drift.py`` fails when the models and the files disagree.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from loopwarden.generate import SCHEMAS
from shared import subjects as S
from shared.messages import WIRE_MODELS

OUT = SCHEMAS / "messages"

# Which contract travels on which subject (the catalogue a new consumer reads first). ``<run>``:
# every event of a run ends with the run id (``S.run_scoped``), so one run is a subject filter.
CATALOGUE: dict[str, str] = {
    f"{S.RUN_SUBMIT_PREFIX}.<tenant>": "RunSubmit",
    S.RUN_SPAWN: "RunSubmit",
    S.RUN_ADVANCE: "RunAdvance",
    f"{S.TOOL_EXECUTE_PREFIX}.<tool>": "ToolCall",
    S.RESULT_VALIDATE: "ToolResultRaw",
    S.JUDGE_SCORE: "JudgeRequest",
    S.ESCALATION_RAISE: "EscalationRaise",
    f"{S.BUDGET_RESERVE} (request/reply)": "BudgetRequest -> BudgetDecision | ErrorReply",
    f"{S.ESCALATION_LIST} (request/reply)": "EscalationQuery -> EscalationReply",
    f"{S.ESCALATION_SHOW} (request/reply)": "EscalationQuery -> EscalationReply",
    f"{S.ESCALATION_CLAIM}.<operator>|.console.<operator> (request/reply)": "EscalationClaim -> EscalationReply",
    f"{S.ESCALATION_RPC_PREFIX}.renew.<operator>|...": "EscalationClaim -> EscalationReply",
    f"{S.ESCALATION_RESOLVE}.<operator>|.console.<operator> (request/reply)": "EscalationResolve -> EscalationReply",
    f"{S.RUN_EVENT_PREFIX}.<kind>.<run>": "RunEvent (the member whose kind is <kind>)",
    f"{S.TOOL_SUCCEEDED_PREFIX}.<tool>.<run>": "ToolOutcome",
    f"{S.TOOL_ATTEMPT_PREFIX}.<tool>.<run>": "ToolAttempt",
    f"{S.FAILURE_PREFIX}.<input_invalid|output_invalid|transient|timeout|fatal|unknown_outcome>"
    ".<tool>.<run>": "ToolOutcome",
    f"{S.FAILURE_PREFIX}.<loop|budget|judge>.<tool|_>.<run>": "RunEvent (LoopDetected | GuardTripped | NotJudged)",
    f"{S.BUDGET_EVENT_PREFIX}.<warn|compact|block|fallback>.<run>": "RunEvent (BudgetThreshold)",
    f"{S.JUDGE_VERDICT}.<run>": "Verdict",
    f"{S.ESCALATION_RAISED}.<run>": "Escalation",
    f"{S.ESCALATION_CLAIMED}.<run>": "EscalationEvent",
    f"{S.ESCALATION_EVENT_PREFIX}.<renewed|expired|refused|sla_applied>.<run>": "EscalationEvent",
    f"{S.ESCALATION_RESOLVED}.<run>": "EscalationResolution",
    f"{S.DLQ_PREFIX}.<service>": "DeadLetter",
    f"{S.REQUEUE_PREFIX}.<service>": "Requeue",
    f"kv {S.KV_CONTRACTS}": "ToolContract",
    f"kv {S.KV_TOOL_CACHE}": "CachedToolResult",
    f"kv {S.KV_ESCALATIONS}": "Escalation",
    f"{S.FAILURE_PREFIX}.tool_error.<tool>.<run>": "ToolOutcome",
    f"{S.MCP_SERVER_EVENT_PREFIX}.<server>": "McpServerStatus",
    f"kv {S.KV_MCP_SERVERS}": "McpServerStatus",
    f"kv {S.KV_RUNS}": "RunSnapshot",
    f"kv {S.KV_HISTORY} (<run>.<seq>)": "ChatMessage",
    f"{S.AGENT_REGISTER_PREFIX}.<operator> (request/reply)": "AgentRegister -> AgentRegisterReply",
    f"kv {S.KV_AGENTS}": "AgentRecord",
    f"kv {S.KV_CONFIG} (access)": "AccessRecord",
    f"kv {S.KV_CONFIG} (console)": "ConsoleUsers",
}


def render() -> dict[str, str]:
    """File name -> file content, deterministic."""
    files: dict[str, str] = {}
    for model in WIRE_MODELS:
        schema: dict[str, Any] = model.model_json_schema(by_alias=True)
        schema = {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": f"https://loopwarden.dev/schemas/{S.VERSION}/{model.__name__}.json",
            **schema,
        }
        files[f"{model.__name__}.json"] = json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    files["catalogue.json"] = json.dumps({"version": S.VERSION, "subjects": CATALOGUE}, indent=2) + "\n"
    return files


def write() -> list[Path]:
    OUT.mkdir(parents=True, exist_ok=True)
    wanted = render()
    for stale in OUT.glob("*.json"):
        if stale.name not in wanted:
            stale.unlink()
    for name, content in wanted.items():
        (OUT / name).write_text(content)
    return [OUT / name for name in wanted]
