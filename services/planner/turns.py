"""Starting and advancing a run: its configuration, its first message, each model turn and the
tool calls that turn makes (dispatched, blocked, or caught as a loop).

A model turn that ends with no call pending ends the iteration (``judging.finish_iteration``).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any, assert_never

from services.planner import context as C
from services.planner import delegation, ids, loops
from services.planner.judging import decide_next, finish_iteration
from services.planner.outbox import Outbox, finish
from services.planner.outcomes import unknown_tool

# --- starting a run: ``starting.py`` (re-exported: callers import them from here) ----------------------------
from services.planner.starting import begin_run as begin_run
from services.planner.starting import queue_run as queue_run
from services.planner.starting import refuse_run as refuse_run
from services.planner.starting import resolve_config as resolve_config
from services.planner.starting import start_run as start_run
from services.planner.state import RunState, ToolCallRecord
from shared import subjects as S
from shared.messages import (
    Candidate,
    ChatMessage,
    GuardTripped,
    ModelCalled,
    ModelCalledDetail,
    ModelStopped,
    ModelStoppedDetail,
    ReasonDetail,
    RequestedCall,
    SimulatedCall,
    TextBlock,
    ToolCall,
    ToolContract,
    ToolUseBlock,
    Usage,
)
from shared.providers.base import ModelRequest, ModelResponse

# --- model turns ------------------------------------------------------------------------------


def apply_guard(state: RunState, reason: str) -> Outbox:
    """The governor blocked the iteration before its model call (the budget is spent)."""
    out = Outbox(state)
    state.iteration.guard = reason
    out.add(
        S.failure("budget", None),
        GuardTripped(**out.head(reason), kind="guard.budget", detail=ReasonDetail(reason=reason)),
        ids.guard(state.run_id, state.iteration.n),
    )
    decide_next(out)
    return out


def apply_provider_failure(state: RunState, reason: str) -> Outbox:
    out = Outbox(state)
    finish(out, "failed", reason)
    return out


def apply_wrap_up(state: RunState, response: ModelResponse, reason: str, offered: Sent | None = None) -> Outbox:
    """The wrap-up turn answered (without tools): the run stops with that answer, saying why."""
    out = Outbox(state)
    it = state.iteration
    it.wrap_up = reason
    request = sent(state, offered)
    state.model_calls += 1
    state.usage = state.usage + response.usage
    state.rate_limited_s = round(state.rate_limited_s + response.rate_limit_wait_s, 3)
    text = (response.text or "").strip()
    state.messages.append(ChatMessage.user(C.wrap_up_note(reason)))
    state.messages.append(ChatMessage(role="assistant", content=[TextBlock(text=text)]))
    out.event(
        ModelCalled(
            **out.head(f"wrap-up turn {it.n}: {len(text)} chars"),
            detail=ModelCalledDetail(
                input_tokens=response.usage.input_tokens,
                output_tokens=response.usage.output_tokens,
                cost_usd=response.usage.cost_usd,
                model=response.model,
                chars=len(text),
                cache_read_input_tokens=response.usage.cache_read_input_tokens,
                cache_creation_input_tokens=response.usage.cache_creation_input_tokens,
                rate_limit_wait_s=round(response.rate_limit_wait_s, 3),
                wrap_up=True,
                **request,
            ),
        )
    )
    if text:
        state.last_text = state.last_answer = text
        answer = Candidate(id=ids.wrap_up_candidate(state.run_id, it.n), iteration=it.n, kind="text", content=text)
        finish(out, "stopped", f"wrapped up: {reason}; final answer written without tools", accepted=answer)
    else:
        finish(out, "stopped", f"wrapped up: {reason}; the model gave no final answer")
    return out


def apply_model_stop(state: RunState, kind: str, reason: str, usage: Usage) -> Outbox:
    """The model stopped without an answer (``StopReasonError``): billed, then a typed end. A refusal
    stops the run (nothing is retried or escalated: the model declined the task); a reply cut off
    even with more room, or a full context window, fails it."""
    out = Outbox(state)
    state.model_calls += 1
    state.usage = state.usage + usage
    out.event(
        ModelStopped(
            **out.head(reason),
            detail=ModelStoppedDetail(
                stop_reason=kind,
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
                cost_usd=usage.cost_usd,
            ),
        )
    )
    if kind == "refusal":
        finish(out, "stopped", f"refused by the model: {reason}")
    else:
        finish(out, "failed", f"model turn unusable ({kind}): {reason}")
    return out


@dataclass(frozen=True)
class Sent:
    """What a turn's request carried that the run view shows: the system prompt as sent (the run's
    instructions and rules, plus the progressive-disclosure line or a compaction's effects when they
    apply) and the names of the tools offered (summarized or whole)."""

    system: str
    tools: tuple[str, ...]

    @classmethod
    def of(cls, request: ModelRequest) -> Sent:
        return cls(request.system, tuple(spec.name for spec in request.tools))


def sent(state: RunState, request: Sent | None) -> dict[str, Any]:
    """What a model turn records of its request (before the turn is counted): the system prompt by hash and
    the tools offered, each only when it differs from what this run's last turn recorded (the text with the
    hash: the run view finds it by hash), and nothing when both are as before (the run view reads the last turn
    that named them: ``loopwarden.runtree.detail.sent_before``). The conversation it carried is the run's
    history, stored apart."""
    if request is None:  # an answer stored by a replica of an earlier version: what it sent is not known
        return {}
    sha = hashlib.sha256(request.system.encode()).hexdigest()
    tools = list(request.tools)
    tools_sha = hashlib.sha256("\n".join(tools).encode()).hexdigest()[:16]
    out: dict[str, Any] = {}
    if sha != state.system_sha256:
        out |= {"system_sha256": sha, "system": request.system}
    if tools_sha != state.tools_sha256:
        out["tools_offered"] = tools
    state.system_sha256, state.tools_sha256 = sha, tools_sha
    return out


def apply_model_response(
    state: RunState, response: ModelResponse, contracts: dict[str, ToolContract], offered: Sent | None = None
) -> Outbox:
    out = Outbox(state)
    it = state.iteration
    cfg = state.config
    request = sent(state, offered)
    state.model_calls += 1
    state.usage = state.usage + response.usage
    state.rate_limited_s = round(state.rate_limited_s + response.rate_limit_wait_s, 3)
    text = response.text or ""
    if text.strip():
        state.last_text = text
    blocks: list[Any] = ([TextBlock(text=text)] if text else []) + list(response.tool_calls)
    state.messages.append(ChatMessage(role="assistant", content=blocks or [TextBlock(text="")]))
    out.event(
        ModelCalled(
            **out.head(
                f"model turn {it.n}: {len(response.tool_calls)} tool call(s)"
                + (f" ({', '.join(call.name for call in response.tool_calls)})" if response.tool_calls else "")
                + f", {len(text)} chars"
            ),
            detail=ModelCalledDetail(
                input_tokens=response.usage.input_tokens,
                output_tokens=response.usage.output_tokens,
                cost_usd=response.usage.cost_usd,
                model=response.model,
                tool_calls=len(response.tool_calls),
                chars=len(text),
                cache_read_input_tokens=response.usage.cache_read_input_tokens,
                cache_creation_input_tokens=response.usage.cache_creation_input_tokens,
                rate_limit_wait_s=round(response.rate_limit_wait_s, 3),
                **request,
                calls=[
                    RequestedCall(
                        tool=call.name, call_id=call.id, arguments=json.dumps(call.input, ensure_ascii=False)[:160]
                    )
                    for call in response.tool_calls
                ],
            ),
        )
    )

    if not response.tool_calls:
        # A text that only *claims* a tool call is not an answer (nor a submission): say so and go on.
        # In text mode a reply may well mention a tool by name; only a call written out as markup is one.
        claims = _writes_tool_call if cfg.answer_mode == "text" else _describes_tool_call
        simulated = bool(text.strip()) and claims(text, contracts)
        if simulated:
            it.notes.append(C.SIMULATED_CALL_NOTE)
            out.event(SimulatedCall(**out.head("a tool call was described in text, not made")))
        elif cfg.answer_mode != "submit" and text.strip():
            it.candidate = Candidate(id=ids.candidate(state.run_id, it.n), iteration=it.n, kind="text", content=text)
            state.last_answer = text
        finish_iteration(out)
        return out

    for call in response.tool_calls:
        _dispatch(out, call, contracts)
    if not it.pending and state.awaiting is None:
        finish_iteration(out)
    return out


_CALL_MARKUP = re.compile(r"<(tool_call|tool_use|function_call)\b")


def _writes_tool_call(text: str, contracts: dict[str, ToolContract]) -> bool:
    """The text *is* a tool call written out: call markup, or a JSON object naming a tool."""
    if _CALL_MARKUP.search(text):
        return True
    names = "|".join(re.escape(n) for n in contracts)
    return bool(names) and re.search(rf"\"name\"\s*:\s*\"({names})\"", text) is not None


def _describes_tool_call(text: str, contracts: dict[str, ToolContract]) -> bool:
    """The text claims a tool call in any way: written out, or in prose (``called search``, ``search(``)."""
    if _writes_tool_call(text, contracts):
        return True
    names = "|".join(re.escape(n) for n in contracts)
    return bool(names) and re.search(rf"(\b({names})\s*\()|(\bcall(ed|ing)?\s+`?({names})`?)", text) is not None


def _dispatch(out: Outbox, call: ToolUseBlock, contracts: dict[str, ToolContract]) -> None:
    s, it, cfg = out.state, out.state.iteration, out.state.config
    sig = loops.signature(call.name, call.input)
    record = ToolCallRecord(
        call_id=call.id,
        tool=call.name,
        arguments=call.input,
        iteration=it.n,
        signature=sig,
        terminal=call.name in cfg.terminal_tools,
    )
    it.tool_calls.append(record)
    if call.name == delegation.DELEGATE and delegation.offered(cfg):
        s.tool_history.append((call.name, sig))
        delegation.dispatch(out, record)
        return
    contract = contracts.get(call.name)
    offered = cfg.allowed_tools is None or call.name in cfg.allowed_tools or call.name in cfg.terminal_tools
    if contract is None or not offered:
        # No replica hosts it (or the run does not offer it): a typed failure the model sees with the
        # tools it may call, counted, and a human past the correction cap; never a silent skip.
        available = sorted(
            n for n in contracts if cfg.allowed_tools is None or n in cfg.allowed_tools or n in cfg.terminal_tools
        )
        s.tool_history.append((call.name, sig))
        unknown_tool(out, record, available)
        return
    # A tool in a schema-failure streak is on the correction path, which has its own cap and
    # ends with a human: repeating an invalid call is a failed correction, not a loop.
    in_correction = s.schema_streak.get(call.name, 0) > 0
    finding = (
        None
        if in_correction
        else loops.check_call(
            s.tool_history, call.name, sig, window=cfg.loop_window, threshold=cfg.loop_repeat_threshold
        )
    )
    s.tool_history.append((call.name, sig))
    if finding is not None:
        _block(record, finding.reflection)  # the reflection is this call's result
        loops.react(out, finding, record.tool, record.call_id)
        return
    record.terminal = contract.terminal or call.name in cfg.terminal_tools
    out.add(
        S.tool_execute(call.name),
        ToolCall(
            run_id=s.run_id,
            iteration=it.n,
            call_id=call.id,
            attempt_id=ids.attempt(s.run_id, it.n, call.id),
            tool=call.name,
            requested_tool=call.name,
            arguments=call.input,
            tenant=s.tenant,  # carried to its outcome: a queue item filed from its failure says whose it is
        ),
        ids.tool_call(s.run_id, it.n, call.id),
    )


def _block(record: ToolCallRecord, message: str) -> None:
    record.status = "blocked"
    record.result_text = message
    record.is_error = True


# --- context compaction -----------------------------------------------------------------------


def apply_compaction(state: RunState, older_count: int, summary: str, usage: Usage) -> None:
    """Replace the older part of the conversation with a summary (recent turns stay verbatim)."""
    older, recent = C.split_for_compaction(state.messages, state.config.keep_recent_turns)
    if not older or len(older) != older_count:
        return
    state.usage = state.usage + usage
    state.compactions += 1
    state.summary = summary
    head = recent[0]
    note = TextBlock(text=f"Summary of earlier work (older turns were compacted to save context):\n{summary}")
    state.messages = [ChatMessage(role="user", content=[*head.content, note]), *recent[1:]]


# --- what a taken turn decided, applied ----------------------------------------------------------
#
# The handler takes a turn (``model_turns``: the budget, the model) and gets one of these back; the
# transaction applies it to the run as stored (``apply_turn``), which may have moved on meanwhile.


@dataclass(frozen=True)
class Compaction:
    """The older part of the conversation, summarized before the turn's call."""

    older_count: int
    summary: str
    usage: Usage


@dataclass(frozen=True)
class Blocked:
    """The budget blocked the turn (or the wrap-up turn's call failed): the guard stops it."""

    reason: str


@dataclass(frozen=True)
class ProviderFailed:
    """No model to call, the governor refused the request, or the call failed for good: the run fails."""

    reason: str


@dataclass(frozen=True)
class Stopped:
    """The model was billed but gave no usable turn (a refusal, a reply cut off, ...)."""

    kind: str
    reason: str
    usage: Usage


@dataclass(frozen=True)
class Answered:
    """The model answered turn ``iteration`` with the model the budget chose."""

    iteration: int
    model: str
    response: ModelResponse
    contracts: dict[str, ToolContract]
    compaction: Compaction | None = None
    sent: Sent | None = None  # what the request carried (the run view's "what was sent")


@dataclass(frozen=True)
class WrappedUp:
    """The run's last, tool-less turn (``reason`` says why) answered."""

    iteration: int
    model: str
    response: ModelResponse
    reason: str
    sent: Sent | None = None


TurnResult = Blocked | ProviderFailed | Stopped | Answered | WrappedUp


def on_turn(s: RunState, iteration: int) -> bool:
    """The run is still running the turn a model answer was for (not a stale or repeated answer)."""
    return s.iteration.n == iteration and not s.done and s.status == "running"


def adopt_model(s: RunState, model: str) -> None:
    """The budget chose this model for the turn: recorded, with a warning when it switched."""
    if model != s.model:
        s.warnings.append(f"budget: switched model {s.model} -> {model}")
        s.model = model


def apply_turn(state: RunState, result: TurnResult) -> Outbox | None:
    """What a taken turn decided, applied to the run as stored (None: the answer is for a turn the
    run has left)."""
    match result:
        case Blocked(reason):
            return apply_guard(state, reason)
        case ProviderFailed(reason):
            return apply_provider_failure(state, reason)
        case Stopped(kind, reason, usage):
            return apply_model_stop(state, kind, reason, usage)
        case Answered(iteration=n) | WrappedUp(iteration=n) if not on_turn(state, n):
            return None
        case Answered(model=model, response=response, contracts=contracts, compaction=compaction, sent=offered):
            if compaction is not None:
                apply_compaction(state, compaction.older_count, compaction.summary, compaction.usage)
            adopt_model(state, model)
            return apply_model_response(state, response, contracts, offered)
        case WrappedUp(model=model, response=response, reason=reason, sent=offered):
            adopt_model(state, model)
            return apply_wrap_up(state, response, reason, offered)
        case _:
            assert_never(result)
