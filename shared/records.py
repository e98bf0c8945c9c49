"""Run records (pure): the exported form of one run, turning it into a scenario, comparing two runs,
and the retention rules.

An export (``loopwarden export RUN``) is one self-contained JSON document, ``RunRecord`` (schema in
``schemas/records/RunRecord.json``): the task and configuration, the conversation, every model call
(the response as stored per turn, and how many messages of the conversation the request carried),
every tool call with its attempts, raw output and validated outcome, the verdicts, escalations and
their resolutions, the budget ledger, usage and cost, the trace id, and the run's events verbatim.

``scenario_from_record`` turns it into a scenario: the recorded model turns become the scripted
planner turns, the recorded tool attempts and raw outputs become scripted tool behaviour, the
verdicts become scripted judge replies, and the outcome becomes ``expect``. Replaying it runs the
current code over the recorded inputs; ``trajectory`` / ``divergences`` compare what the current code
decided (Decide rows, validation results, budget actions) with what the recorded run decided.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.failures import SCHEMA_FAILURES, SCRIPTED_FAILURES, FailureType

FORMAT = "loopwarden.run-record"
TERMINAL = ("completed", "stopped", "failed")  # a run that ran and ended (a replay can play it back)
RETIRED = (*TERMINAL, "refused")  # and a submit that never started: retention takes both


class _Rec(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ModelCallRecord(_Rec):
    key: str = Field(description="the lw_model_calls key: <run>.turn<N> or <run>.compact<N>")
    purpose: Literal["plan", "summarize"]
    n: int = Field(description="the iteration (plan) or compaction (summarize) number")
    request_messages: int | None = Field(
        None, description="plan calls: how many messages of `messages` the request carried (before this turn)"
    )
    response: dict[str, Any] = Field(description="the model's response as stored: text, tool_calls, usage, model")


class ToolAttemptRecord(_Rec):
    attempt: int
    ok: bool
    failure_type: FailureType | None = None
    error: str | None = None


class ToolCallExport(_Rec):
    attempt_id: str
    iteration: int
    call_id: str
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    attempts: list[ToolAttemptRecord] = Field(default_factory=list)
    raw_output: Any = Field(None, description="what the tool returned (after its post-call hook), before validation")
    output_is_text: bool = False
    has_output: bool = False
    outcome: dict[str, Any] | None = Field(None, description="the validated outcome event (success or failure)")


class EventRecord(_Rec):
    subject: str
    kind: str
    seq: int
    time: datetime | None = None
    payload: dict[str, Any]


class RunRecord(_Rec):
    format: Literal["loopwarden.run-record"] = "loopwarden.run-record"
    version: int = 1
    run_id: str
    exported_at: datetime
    task: str
    status: str
    final_output: str | None = None
    final_reason: str | None = None
    passed: bool | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    trace_id: str | None = None
    provider: str = Field(description="'scripted' (submitted with a scenario) or 'live' (a model provider)")
    config: dict[str, Any] = Field(description="the run's configuration (limits, rubric, answer mode, model, ...)")
    usage: dict[str, Any] = Field(default_factory=dict, description="tokens in and out, cost in USD (whole run)")
    messages: list[dict[str, Any]] = Field(default_factory=list, description="the conversation the model saw")
    model_calls: list[ModelCallRecord] = Field(default_factory=list)
    tool_calls: list[ToolCallExport] = Field(default_factory=list)
    verdicts: list[dict[str, Any]] = Field(default_factory=list)
    escalations: list[dict[str, Any]] = Field(default_factory=list, description="queue items with their resolutions")
    budget: dict[str, Any] | None = Field(None, description="the governor's ledger for the run")
    scenario: dict[str, Any] | None = Field(None, description="the scenario the run was submitted with, if scripted")
    events: list[EventRecord] = Field(default_factory=list, description="every event of the run, oldest first")
    state: dict[str, Any] | None = Field(None, description="the planner's last run state, verbatim")


def is_record(data: Any) -> bool:
    return isinstance(data, dict) and data.get("format") == FORMAT


# --- retention (pure) ----------------------------------------------------------------------------------


def run_expired(status: str, updated_at: datetime, now: datetime, retention_s: float) -> bool:
    """A run's records may go only when the run is finished and has been for ``retention_s``.
    A running run, or one waiting on a human, never expires, however old."""
    return status in RETIRED and now - updated_at >= timedelta(seconds=retention_s)


def escalation_expired(item: dict[str, Any], now: datetime, retention_s: float) -> bool:
    """A queue item (an audit record) goes only once resolved, ``retention_s`` after its resolution."""
    if item.get("status") != "resolved":
        return False
    resolution = item.get("resolution") or {}
    at = resolution.get("at") or resolution.get("resolved_at") or item.get("created_at")
    if not at:
        return False
    when = datetime.fromisoformat(str(at).replace("Z", "+00:00"))
    return now - when >= timedelta(seconds=retention_s)


# --- record -> scenario ----------------------------------------------------------------------------------

_TURN = re.compile(r"\.turn(\d+)$")


def scenario_from_record(record: RunRecord, name: str | None = None) -> dict[str, Any]:
    """The scenario that replays ``record`` offline: recorded model turns, tool results and judge replies.
    A plain dict (validated by ``shared.scenario.parse_scenario``), so it can be written as YAML."""
    planner: list[dict[str, Any]] = []
    summaries: list[str] = []
    for call in sorted(record.model_calls, key=lambda c: (c.purpose, c.n)):
        resp = call.response
        if call.purpose == "summarize":
            summaries.append(str(resp.get("text", "")))
            continue
        turn: dict[str, Any] = {"text": resp.get("text", "")}
        calls = [
            {"name": tc["name"], "input": tc.get("input", {}), "id": tc.get("id")} for tc in resp.get("tool_calls", [])
        ]
        if calls:
            turn["tool_calls"] = calls
        usage = resp.get("usage") or {}
        if usage.get("input_tokens") or usage.get("output_tokens"):
            turn["usage"] = {
                "input_tokens": int(usage.get("input_tokens", 0)),
                "output_tokens": int(usage.get("output_tokens", 0)),
            }
        planner.append(turn)
    tools: dict[str, list[dict[str, Any]]] = {}
    for tc in sorted(record.tool_calls, key=lambda t: (_first_seq(record, t.attempt_id), t.attempt_id)):
        for a in sorted(tc.attempts, key=lambda a: a.attempt):
            entry: dict[str, Any]
            if not a.ok:
                kind = a.failure_type if a.failure_type in SCRIPTED_FAILURES else "fatal"
                entry = {"fail": kind, "error": a.error or f"recorded {kind} failure"}
            elif tc.has_output and tc.output_is_text and isinstance(tc.raw_output, str):
                entry = {"output_text": tc.raw_output}
            elif tc.has_output:
                entry = {"output": tc.raw_output}
            else:
                continue  # an attempt whose output was not recorded: the real tool runs
            tools.setdefault(tc.tool, []).append(entry)
    judge: list[dict[str, Any]] = []
    for v in record.verdicts:
        if v.get("status") == "not_judged":
            judge.append({"raw": f"(recorded: not judged: {v.get('not_judged_reason') or ''})"})
        else:
            crit = v.get("criteria") or []
            judge.append(
                {
                    "scores": {c["name"]: c["score"] for c in crit},
                    "reasons": {c["name"]: c.get("reason", "") for c in crit if c.get("reason")},
                }
            )
    cfg = record.config
    limits = {
        k: cfg[k]
        for k in (
            "max_iterations",
            "max_judge_retries",
            "max_schema_corrections",
            "cost_ceiling_usd",
            "run_token_budget",
            "context_budget_tokens",
            "not_judged_policy",
            "loop_policy",
            "loop_repeat_threshold",
        )
        if cfg.get(k) is not None
    }
    expect: dict[str, Any] = {"status": record.status}
    if record.final_output is not None and record.status == "completed":
        expect["final_output_equals"] = record.final_output
    expect["model_calls"] = len(planner)
    out: dict[str, Any] = {
        "name": name or f"replay-{record.run_id}",
        "description": f"replay of run {record.run_id} (exported {record.exported_at.isoformat()}, "
        f"recorded with the {record.provider} provider)",
        "task": record.task,
        "planner": planner,
        "judge": judge,
        "summaries": summaries,
        "tools": tools,
        "limits": limits,
        "answer_mode": cfg.get("answer_mode", "auto"),
        "terminal_tools": cfg.get("terminal_tools", ["submit_result"]),
        "expect": expect,
    }
    if cfg.get("rubric"):
        out["rubric"] = cfg["rubric"]
    if cfg.get("allowed_tools") is not None:
        out["allowed_tools"] = cfg["allowed_tools"]
    return out


def _first_seq(record: RunRecord, attempt_id: str) -> int:
    for e in record.events:
        if e.payload.get("attempt_id") == attempt_id:
            return e.seq
    return 1 << 62


# --- comparing runs -------------------------------------------------------------------------------------


class Step(BaseModel):
    """One decision of a run that a replay must reproduce."""

    what: Literal["decide", "validation", "budget"]
    key: str = Field(description="where in the run: iteration, and tool for a validation")
    value: str


def trajectory(events: list[EventRecord]) -> list[Step]:
    """A run's decisions in order: each Decide row, each tool call's validation result, each budget action."""
    out: list[Step] = []
    for e in events:
        p = e.payload
        if e.kind == "run.decided":
            d = p.get("detail") or {}
            out.append(
                Step(
                    what="decide", key=f"iteration {p.get('iteration')}", value=f"row {d.get('row')}: {d.get('action')}"
                )
            )
        elif e.kind.startswith("tool.succeeded."):
            tool = e.kind.removeprefix("tool.succeeded.")
            value = "valid (repaired)" if p.get("repaired") else "valid"
            out.append(Step(what="validation", key=f"iteration {p.get('iteration')} {tool}", value=value))
        elif e.kind.startswith("failure.") and not p.get("will_retry"):
            parts = e.kind.split(".")
            if len(parts) >= 3 and parts[1] in SCHEMA_FAILURES:
                out.append(Step(what="validation", key=f"iteration {p.get('iteration')} {parts[2]}", value=parts[1]))
        elif e.kind.startswith("budget."):
            out.append(Step(what="budget", key=f"iteration {p.get('iteration')}", value=e.kind.removeprefix("budget.")))
    return out


def divergences(recorded: list[Step], replayed: list[Step]) -> list[str]:
    """Where the replay differs, per kind of decision: the first differing step of each kind, and any
    step one side has and the other lacks. Empty when the replay decided exactly as recorded."""
    out: list[str] = []
    for what in ("decide", "validation", "budget"):
        a = [s for s in recorded if s.what == what]
        b = [s for s in replayed if s.what == what]
        for i in range(max(len(a), len(b))):
            x = a[i] if i < len(a) else None
            y = b[i] if i < len(b) else None
            if x is not None and y is not None and (x.key, x.value) == (y.key, y.value):
                continue
            left = f"{x.key}: {x.value}" if x else "(nothing)"
            right = f"{y.key}: {y.value}" if y else "(nothing)"
            out.append(f"{what} #{i + 1}: recorded {left}; replay {right}")
            break
    return out
