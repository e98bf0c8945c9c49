"""A step, opened: what the console and the terminal show of one step (``step_detail``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from loopwarden.runtree.tree import _detail, _iteration_of, build
from shared.records import EventRecord, RunRecord


@dataclass
class Section:
    """One part of an opened step: a heading and its body (text, or a value shown as JSON)."""

    key: str  # a stable name, e.g. "raw-output", "errors", "criteria"
    title: str
    body: Any
    as_json: bool = True

    @property
    def text(self) -> str:
        if not self.as_json:
            return str(self.body)
        return json.dumps(self.body, indent=2, ensure_ascii=False, default=str)


def _events_for(record: RunRecord, pred: Any) -> list[EventRecord]:
    return [e for e in sorted(record.events, key=lambda e: e.seq) if pred(e)]


def _model_sections(record: RunRecord, n: int) -> list[Section]:
    out: list[Section] = []
    turn = next(
        (e for e in record.events if e.kind in ("run.model_called", "run.model_stopped") and _iteration_of(e) == n),
        None,
    )
    d = _detail(turn) if turn else {}
    call = next((c for c in record.model_calls if c.purpose == "plan" and c.n == n), None)
    config = record.config or {}
    sha = str(sent_before(record, turn, "system_sha256") or "")
    system = system_prompt(record, sha) if sha else None
    if system is not None:
        said = f"sha256 {sha[:12]}…, {len(system)} characters (below)"
    elif sha:
        said = f"sha256 {sha[:12]}…: its text is on the run's first model turn, which is not stored here"
    else:
        said = "not recorded (a run from before model turns recorded their system prompt)"
    offered = sent_before(record, turn, "tools_offered")
    if offered is None:  # an older turn: what the run allowed
        offered = config.get("allowed_tools") or "every registered tool"
    out.append(
        Section(
            "sent",
            "Sent",
            {
                "model": d.get("model") or config.get("model"),
                "system": said,
                "tools offered": offered,
                "max output tokens": config.get("max_output_tokens"),
                "cache": {
                    "read (cached) tokens": d.get("cache_read_input_tokens", 0),
                    "written tokens": d.get("cache_creation_input_tokens", 0),
                    "breakpoints": "system prompt and tools, and the conversation's last message",
                },
            },
        )
    )
    if system is not None:
        out.append(Section("system", "System prompt", system, as_json=False))
    if call is not None and call.request_messages is not None and record.messages:
        out.append(
            Section(
                "conversation",
                f"Conversation carried ({call.request_messages} messages)",
                record.messages[: call.request_messages],
            )
        )
    elif record.messages:
        out.append(
            Section("conversation", "Conversation (whole run; the request's cut was not stored)", record.messages)
        )
    if call is not None:
        r = call.response
        out.append(
            Section(
                "response",
                "Came back",
                {
                    "text": r.get("text"),
                    "tool calls": r.get("tool_calls"),
                    "stop reason": r.get("stop_reason"),
                    "usage": r.get("usage"),
                },
            )
        )
    elif d:
        out.append(Section("response", "Came back (from the event; the response record was not readable)", d))
    return out


def sent_before(record: RunRecord, turn: EventRecord | None, key: str) -> Any:
    """What ``turn`` recorded of its request under ``key`` (``system_sha256``, ``tools_offered``): a turn records
    each only when it changed, so a turn without it was sent what the run's last turn that names it recorded
    (a run from before that names it on every turn). None: no turn up to this one names it."""
    if turn is None:
        return None
    if _detail(turn).get(key) is not None:
        return _detail(turn).get(key)
    earlier = _events_for(record, lambda e: e.kind == "run.model_called" and e.seq < turn.seq)
    return next((_detail(e)[key] for e in reversed(earlier) if _detail(e).get(key) is not None), None)


def system_prompt(record: RunRecord, sha256: str) -> str | None:
    """The text of the system prompt a model turn names by hash: carried once, by the run's first turn that
    sent it (None when no stored event of the run carries it)."""
    for e in record.events:
        d = _detail(e)
        if e.kind == "run.model_called" and d.get("system_sha256") == sha256 and isinstance(d.get("system"), str):
            return str(d["system"])
    return None


def _tool_sections(record: RunRecord, step_id: str) -> list[Section]:
    call_id = step_id.split(".tool.", 1)[1].removesuffix(".fb")
    outcomes = _events_for(
        record,
        lambda e: (
            (e.kind.startswith("tool.succeeded.") or e.kind.startswith("failure."))
            and str(e.payload.get("attempt_id", "")).endswith(f".{call_id}")
        ),
    )
    attempts = _events_for(
        record,
        lambda e: e.kind.startswith("tool.attempt.") and str(e.payload.get("attempt_id", "")).endswith(f".{call_id}"),
    )
    final = next((e.payload for e in reversed(outcomes) if not e.payload.get("will_retry")), None)
    export = next((t for t in record.tool_calls if t.call_id == call_id), None)
    out: list[Section] = []
    arguments = (final or {}).get("arguments") or (export.arguments if export else None)
    out.append(Section("arguments", "Arguments", arguments))
    rows = [{k: a.payload.get(k) for k in ("attempt", "ok", "failure_type", "error", "next_delay_s")} for a in attempts]
    if final is not None:
        rows.append(
            {
                "attempt": final.get("attempts"),
                "ok": bool(final.get("success")) or final.get("failure_type") in ("output_invalid",),
                "outcome": "returned"
                if final.get("failure_type") in (None, "output_invalid")
                else final.get("failure_type"),
            }
        )
    out.append(Section("attempts", "Attempts", rows))
    if export is not None and export.has_output:
        raw = export.raw_output if not export.output_is_text else str(export.raw_output)
        ref = by_reference(raw)
        out.append(
            Section(
                "raw-output",
                f"Raw output (before validation, {size_text(output_size(raw))})",
                raw if ref is None else f"stored by reference: {size_text(ref[0])}, sha256 {ref[1]}; not read here",
                as_json=not export.output_is_text and ref is None,
            )
        )
    elif final is not None and final.get("failure_type") == "output_invalid":
        out.append(Section("raw-output", "Raw output", "not readable here (kept in the tool ledger)", as_json=False))
    if final is not None:
        if final.get("errors"):
            out.append(Section("errors", "Validation errors", final["errors"]))
        if final.get("repairs"):
            out.append(Section("repairs", "Repairs applied", final["repairs"]))
        if final.get("error"):
            out.append(Section("error", "Error (as the model was told)", str(final["error"]), as_json=False))
        if final.get("success"):
            out.append(Section("data", "Validated result", final.get("data")))
        if final.get("fallback_from"):
            out.append(Section("fallback", "Fallback", final["fallback_from"]))
    seen = _tool_result_seen(record, call_id)
    if seen is not None:
        out.append(Section("seen", "What the model saw (after capping)", seen, as_json=False))
    later = _events_for(
        record,
        lambda e: e.kind == "run.corrected" and e.payload.get("detail", {}).get("tool") == (final or {}).get("tool"),
    )
    if final is not None and not final.get("success") and later:
        out.append(
            Section("correction", "Corrected by the model", [e.payload.get("summary") for e in later], as_json=True)
        )
    return out


def by_reference(value: Any) -> tuple[int, str] | None:
    """(size, sha256) of a claim-check reference left in place of a body (one that could not be fetched)."""
    if isinstance(value, dict) and "$lw_payload_ref" in value:
        value = value["$lw_payload_ref"]
    if isinstance(value, dict) and {"name", "size", "sha256"} <= set(value) and isinstance(value["size"], int):
        return value["size"], str(value["sha256"])
    return None


def output_size(value: Any) -> int:
    """A tool output's size in bytes, as it travelled (text as UTF-8, anything else as compact JSON)."""
    ref = by_reference(value)
    if ref is not None:
        return ref[0]
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), default=str)
    return len(text.encode())


def size_text(n: int) -> str:
    if n < 1024:
        return f"{n} bytes"
    return f"{n / 1024:.1f} KB" if n < 1024 * 1024 else f"{n / 1024 / 1024:.1f} MB"


def _tool_result_seen(record: RunRecord, call_id: str) -> str | None:
    for m in record.messages:
        for b in m.get("content") or []:
            if isinstance(b, dict) and b.get("type") == "tool_result" and b.get("tool_use_id") == call_id:
                return ("✗ " if b.get("is_error") else "") + str(b.get("content"))
    return None


def step_detail(record: RunRecord, step_id: str) -> list[Section]:
    """What a step shows when opened (empty: no such step)."""
    if build(record).find(step_id) is None:
        return []
    if step_id.startswith("esc."):
        eid = step_id[4:]
        item = next((x for x in record.escalations if x.get("escalation_id") == eid), None)
        raised = next(
            (
                e.payload
                for e in record.events
                if e.kind == "escalation.raised" and e.payload.get("escalation_id") == eid
            ),
            {},
        )
        resolved = next(
            (
                e.payload
                for e in record.events
                if e.kind == "escalation.resolved" and e.payload.get("escalation_id") == eid
            ),
            None,
        )
        base = item or raised
        out = [
            Section(
                "raised",
                "Raised",
                {
                    k: base.get(k)
                    for k in (
                        "escalation_id",
                        "kind",
                        "tool",
                        "reason",
                        "allowed_actions",
                        "sla_deadline",
                        "sla_action",
                    )
                    if k in base
                },
            )
        ]
        resolution = (item or {}).get("resolution") or resolved
        if resolution:
            who = "the SLA" if resolution.get("by_sla") else resolution.get("resolved_by") or resolution.get("operator")
            out.append(
                Section(
                    "resolution",
                    "Human resolution",
                    {
                        "who": who,
                        "via": resolution.get("via"),
                        "action": resolution.get("action"),
                        "note": resolution.get("note"),
                        "provided": resolution.get("result"),
                    },
                )
            )
        else:
            out.append(Section("resolution", "Human resolution", "waiting for a person", as_json=False))
        return out
    head, _, rest = step_id.partition(".")
    if not head.startswith("i") or not head[1:].isdigit():
        if step_id == "end":
            return [
                Section(
                    "end",
                    "Ended",
                    {"status": record.status, "reason": record.final_reason, "final output": record.final_output},
                )
            ]
        return []
    n = int(head[1:])
    if rest == "model":
        return _model_sections(record, n)
    if rest.startswith("tool."):
        return _tool_sections(record, step_id)
    if rest == "judge":
        verdicts = [v for v in record.verdicts if int(v.get("iteration") or 0) == n]
        verdicts = verdicts or [e.payload for e in record.events if e.kind == "judge.verdict" and _iteration_of(e) == n]
        out = []
        for v in verdicts:
            out.append(
                Section(
                    "criteria",
                    "Criteria",
                    [
                        {k: c.get(k) for k in ("name", "score", "weight", "hard", "passed", "reason")}
                        for c in v.get("criteria") or []
                    ],
                )
            )
            out.append(
                Section(
                    "verdict",
                    "Verdict",
                    {
                        k: v.get(k)
                        for k in ("status", "score", "threshold", "not_judged_reason", "judge_model", "usage")
                    },
                )
            )
        return out
    if rest.startswith("wait"):
        waits = [e for e in record.events if e.kind == "run.rate_limited" and _iteration_of(e) == n]
        k = int(rest.removeprefix("wait") or 0)
        e = waits[k - 1] if 0 < k <= len(waits) else None
        return [Section("rate_limit", "Waiting for the rate limit", e.payload.get("detail") if e else None)]
    if rest == "decide":
        e = next((e for e in reversed(record.events) if e.kind == "run.decided" and _iteration_of(e) == n), None)
        return [Section("decide", "Decide", e.payload if e else None)]
    if rest == "":
        return [
            Section(
                "events",
                "Events of this iteration",
                [{"kind": e.kind, "summary": e.payload.get("summary")} for e in record.events if _iteration_of(e) == n],
            )
        ]
    return []
