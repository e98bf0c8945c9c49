"""Context assembly: what the model sees on each turn, and how many tokens each part costs.

Pure functions. The context is the task (goal), the conversation (history, possibly with
older turns replaced by a summary), the tool catalogue (tools) and room for the reply
(output); each section is counted with the real tokenizer for the governor.
"""

from __future__ import annotations

import json
import weakref
from collections import OrderedDict
from typing import Any

from services.planner import delegation
from services.planner.state import RunState, ToolCallRecord
from shared import tokens
from shared.bounded import split_bounded
from shared.contracts.validation import format_for_model
from shared.messages import (
    SCHEMA_FAILURES,
    BudgetRequest,
    ChatMessage,
    SectionTokens,
    TextBlock,
    ToolContract,
    ToolOutcome,
    ToolResultBlock,
    Verdict,
)
from shared.providers.base import ModelRequest, ToolSpec

SYSTEM_PROMPT = """You are an agent that completes the user's task with the tools provided.
- Call tools through the tool interface only. Writing a tool call as text does not run it.
- Tool results may be errors written for you: read them, fix the call, or take another approach.
- Do not invent facts a tool did not return.
{finish}"""
FINISH_SUBMIT = "- When you have the answer, call `{tool}` with it. Only a real `{tool}` call submits the answer."
FINISH_TEXT = "- When you have the answer, reply with it as plain text and no tool calls."


def system_prompt(state: RunState) -> str:
    cfg = state.config
    if cfg.answer_mode != "text":
        finish = FINISH_SUBMIT.format(tool=cfg.terminal_tools[0])
    else:
        finish = FINISH_TEXT
    rules = SYSTEM_PROMPT.format(finish=finish)
    return f"{cfg.instructions.strip()}\n\n{rules}" if cfg.instructions.strip() else rules


# --- the tool catalogue: whole, or one line per tool above a size (progressive disclosure) ------
#
# A summarized tool is as short as a valid tool entry gets (the providers need a name and an object
# schema): its name, the first sentence of its description and an open object schema. No per-entry
# marker: one line of the system prompt says, once, what an open schema means, so the section
# costs ~28 tokens per summarized tool with 3-4 sentence descriptions, and stays under a quarter of
# the whole catalogue after a few tools were called and are shown whole (issue 28).

ONE_LINE_SCHEMA: dict[str, Any] = {"type": "object"}
PROGRESSIVE_NOTE = (
    '- Tools whose input_schema is {"type":"object"} are summarized: calling one shows its full schema from then '
    "on (a refused call is returned with it, not run)."
)


class ToolSummary(ToolSpec):
    """A tool offered as a summary (progressive disclosure): the wire form is a plain ``ToolSpec``."""


def one_line(description: str, limit: int = 90) -> str:
    """The first sentence of a description, at most ``limit`` characters."""
    text = " ".join(description.split())
    cut = text.find(". ")
    line = text[: cut + 1] if 0 < cut < limit else text
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


def tool_specs(
    state: RunState, contracts: dict[str, ToolContract], progressive_above: int | None = None
) -> list[ToolSpec]:
    """The tools offered this turn. Above ``progressive_above`` tools, a tool the run has not called
    yet is one line (name, first line of its description, an open object schema); a tool the run has
    called, and the terminal tools, are offered whole. The executor validates every call against the
    real schema either way, so a blind first call is refused with the schema, never run wrong."""
    allowed = state.config.allowed_tools
    offered = [
        c
        for name, c in sorted(contracts.items())
        if allowed is None or name in allowed or name in state.config.terminal_tools
    ]
    delegate = [delegation.DELEGATE_SPEC] if delegation.offered(state.config) else []
    if progressive_above is None or len(offered) <= progressive_above:
        return [spec_of(c, whole=True) for c in offered] + delegate
    used = {name for name, _ in state.tool_history} | set(state.config.terminal_tools)
    return delegate + [spec_of(c, whole=c.name in used) for c in offered]


# per contract object: (the contract, its whole spec, its one-line spec): the same objects every
# turn while the planner keeps its contracts, so each is dumped and counted once (tokens.count_model)
_SPECS: dict[int, tuple[weakref.ref[ToolContract], ToolSpec, ToolSpec]] = {}


def spec_of(c: ToolContract, whole: bool) -> ToolSpec:
    hit = _SPECS.get(id(c))
    if hit is None or hit[0]() is not c:
        full = ToolSpec(name=c.name, description=c.description, input_schema=c.input_schema)
        short = ToolSummary(name=c.name, description=one_line(c.description), input_schema=ONE_LINE_SCHEMA)
        if len(_SPECS) >= 4096:  # ids of dead objects may be reused: the identity check above guards that
            _SPECS.clear()
        hit = _SPECS[id(c)] = (weakref.ref(c), full, short)
    return hit[1] if whole else hit[2]


def tools_tokens(specs: list[ToolSpec]) -> int:
    return sum(tokens.count_model(s) for s in specs)


class Sent:
    """What ``model_messages`` built from a run's history: ``messages[:cut]`` merged, where ``cut`` is
    where the history's last run of same-role messages starts (it may still grow), and the first and
    the last message it covered (by identity: the history is append-only between compactions)."""

    __slots__ = ("cut", "first", "last", "merged")

    def __init__(self, first: ChatMessage, last: ChatMessage, cut: int, merged: list[ChatMessage]) -> None:
        self.first, self.last, self.cut, self.merged = first, last, cut, merged

    def covers(self, messages: list[ChatMessage]) -> bool:
        return len(messages) >= self.cut > 0 and messages[0] is self.first and messages[self.cut - 1] is self.last


def merge(group: list[ChatMessage]) -> ChatMessage:
    """Consecutive messages of one role as one message (the one message itself when it is alone)."""
    if len(group) == 1:
        return group[0]
    return ChatMessage(role=group[0].role, content=[b for m in group for b in m.content])


def model_messages(state: RunState, extra: ChatMessage | None = None) -> list[ChatMessage]:
    """The conversation to send: consecutive messages of one role merged, never ending on an
    assistant turn (providers read that as a prefill).

    Only the messages appended since the last turn are looked at: the rest is what the last turn
    sent, the same objects (so a turn costs the same at step 500 as at step 10, and the per-run
    meters that go by identity, the tokens of a turn and its prompt-cache answer, see an unchanged
    head: after a compaction the first two user turns are merged, and a new merged object every
    turn would make them measure the whole conversation again). A compaction or a reload makes new
    objects: then it is built whole once."""
    messages = state.messages
    sent: Sent | None = state._sent
    if sent is not None and sent.covers(messages):
        merged, start = list(sent.merged), sent.cut
    else:
        merged, start = [], 0
    groups: list[list[ChatMessage]] = []
    for message in messages[start:]:
        if groups and groups[-1][-1].role == message.role:
            groups[-1].append(message)
        else:
            groups.append([message])
    last = groups[-1] if groups else []
    if len(groups) > 1:  # the complete groups are kept for the next turn; the last one may still grow
        merged += [merge(g) for g in groups[:-1]]
        cut = len(messages) - len(last)
        state._sent = Sent(messages[0], messages[cut - 1], cut, list(merged))
    if last:
        merged.append(merge(last))
    if extra is not None:
        if merged and merged[-1].role == extra.role:
            merged[-1] = merge([merged[-1], extra])
        else:
            merged.append(extra)
    if merged and merged[-1].role == "assistant":
        merged.append(ChatMessage.user("Continue."))
    return merged


def sections(
    system: str, task_message: str, messages: list[ChatMessage], specs: list[ToolSpec], max_output: int
) -> SectionTokens:
    history = sum(tokens.count_message(m) for m in messages)
    goal = tokens.count(system) + tokens.count(task_message)
    return SectionTokens(
        goal=goal,
        history=max(0, history - tokens.count(task_message)),
        tools=sum(tokens.count_json(s.model_dump()) for s in specs),
        output=max_output,
    )


# --- counting the history once per message ---------------------------------------------------


class _Tally:
    """A run's history count so far: the first and last message it covered (by identity) and the total."""

    __slots__ = ("first", "last", "length", "total")

    def __init__(self, first: weakref.ref[ChatMessage], last: weakref.ref[ChatMessage], length: int, total: int):
        self.first, self.last, self.length, self.total = first, last, length, total


_TALLIES: OrderedDict[str, _Tally] = OrderedDict()
MAX_TALLIES = 1024


def history_tokens(run_id: str, messages: list[ChatMessage]) -> int:
    """Tokens of ``messages``, counting only the messages added since the last count of this run.

    The planner keeps a run's state between turns, so its earlier messages are the same objects:
    when the first message and the last one counted are still where they were, only the new tail is
    counted (a check at step 80 costs what one at step 10 does). A compaction replaces the head and a
    reload from KV makes new objects: either way the whole history is counted once, then again only
    what is new."""
    tally = _TALLIES.get(run_id)
    if (
        tally is not None
        and messages
        and len(messages) >= tally.length > 0
        and tally.first() is messages[0]
        and tally.last() is messages[tally.length - 1]
    ):
        total = tally.total + sum(tokens.count_message(m) for m in messages[tally.length :])
    else:
        total = sum(tokens.count_message(m) for m in messages)
    if messages:
        _TALLIES[run_id] = _Tally(weakref.ref(messages[0]), weakref.ref(messages[-1]), len(messages), total)
        _TALLIES.move_to_end(run_id)
        while len(_TALLIES) > MAX_TALLIES:
            _TALLIES.popitem(last=False)
    return total


def opening_message(task: str, lessons: list[str]) -> str:
    if not lessons:
        return task
    listed = "\n".join(f"- {lesson}" for lesson in lessons)
    head = "Lessons from earlier attempts at this task (reviewers rejected answers for these reasons):"
    return f"{task}\n\n{head}\n{listed}"


# --- tool results as the model reads them ---------------------------------------------------


def render_data(data: Any, max_tokens: int) -> str:
    """A tool result as the model reads it, cut to ``max_tokens``; the note says how much of the whole result
    the model does not see, counting a cut made earlier (the planner keeps a bounded copy in its run state)."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, indent=None, default=str)
    text, full_bytes = split_bounded(text)
    cut, dropped = tokens.truncate(text, max_tokens)
    if full_bytes is None:
        if dropped:
            cut += f"\n[result truncated: {dropped} more tokens were cut to protect the context budget]"
        return cut
    shown, kept = len(cut.encode()), len(text.encode())
    # the part cut before this render is estimated at this text's own bytes per token
    text_tokens = max_tokens + dropped if dropped else tokens.count(text)
    unseen = dropped + round((full_bytes - kept) * text_tokens / max(kept, 1))
    return cut + (
        f"\n[result truncated: you see the first {shown} of its {full_bytes} bytes; about {unseen} more tokens "
        "were cut to protect the context budget]"
    )


def render_outcome(outcome: ToolOutcome, max_tokens: int) -> tuple[str, bool]:
    """The tool_result text for the model and whether it is an error."""
    notes = []
    if outcome.fallback_from is not None:
        fb = outcome.fallback_from
        notes.append(
            f"Note: '{fb.from_tool}' failed ({fb.reason}); this result comes from the fallback "
            f"tool '{fb.to_tool}' instead."
        )
    if outcome.cached:
        notes.append(
            "Note: the live call failed; this is the last good result for the same arguments, "
            "served from cache and possibly stale."
        )
    if outcome.success:
        body = render_data(outcome.data, max_tokens)
        return ("\n".join([*notes, body]) if notes else body), False
    if outcome.failure_type in SCHEMA_FAILURES:
        return schema_feedback(outcome), True
    return "\n".join([*notes, outcome.error or "the tool failed"]), True


def schema_feedback(outcome: ToolOutcome) -> str:
    """Errors *and* the schema, so the model can build a call that satisfies it."""
    schema = json.dumps(outcome.schema_ or {}, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    if outcome.failure_type == "input_invalid":
        head = f"Your call to '{outcome.tool}' was not executed: its arguments break the tool's input schema."
        tail = "Make a new call whose arguments satisfy this schema."
    else:
        head = f"The tool '{outcome.tool}' returned output that breaks its output contract, so it was rejected."
        tail = "Make a new call (for example with different arguments) or take another approach."
    return f"{head}\n{format_for_model(outcome.errors)}\nSchema:\n{schema}\n{tail}"


def closing_user_message(calls: list[ToolCallRecord], notes: list[str]) -> ChatMessage | None:
    """The user turn that answers every tool_use of the last assistant turn, plus notes."""
    blocks: list[Any] = [
        ToolResultBlock(tool_use_id=c.call_id, content=c.result_text or "(no result)", is_error=c.is_error)
        for c in calls
    ]
    blocks.extend(TextBlock(text=n) for n in notes if n)
    return ChatMessage(role="user", content=blocks) if blocks else None


def split_for_compaction(messages: list[ChatMessage], keep_recent: int) -> tuple[list[ChatMessage], list[ChatMessage]]:
    """Older messages to summarize, and recent ones kept verbatim (starting on a user turn).

    A kept user turn whose tool_results answer a summarized tool_use is turned into text,
    since its tool_use is gone.
    """
    if len(messages) <= keep_recent + 1:
        return [], messages
    cut = len(messages) - keep_recent
    while cut < len(messages) and messages[cut].role != "user":
        cut += 1
    older, recent = messages[1:cut], messages[cut:]
    if not older:
        return [], messages
    if recent and recent[0].role == "user":
        blocks: list[Any] = []
        for b in recent[0].content:
            if isinstance(b, ToolResultBlock):
                blocks.append(TextBlock(text=f"(earlier tool result{' — error' if b.is_error else ''}) {b.content}"))
            else:
                blocks.append(b)
        recent = [ChatMessage(role="user", content=blocks), *recent[1:]]
    return older, [messages[0], *recent]


def transcript(messages: list[ChatMessage]) -> str:
    lines = []
    for m in messages:
        for b in m.content:
            if isinstance(b, TextBlock) and b.text.strip():
                lines.append(f"{m.role}: {b.text.strip()}")
            elif isinstance(b, ToolResultBlock):
                lines.append(f"tool result{' (error)' if b.is_error else ''}: {b.content[:800]}")
            elif b.type == "tool_use":
                lines.append(f"assistant called {b.name}({json.dumps(b.input, ensure_ascii=False)[:400]})")
    return "\n".join(lines)


def model_request(
    state: RunState,
    contracts: dict[str, ToolContract],
    model: str,
    max_tokens: int,
    progressive_above: int | None = None,
    wrap_up: str | None = None,
) -> ModelRequest:
    """This turn's request to the planner's model: the one builder of it. The wrap-up turn (the run's
    last, ``wrap_up`` says why, else the iteration's own reason) is the conversation and a note
    saying why, no tools, a capped reply."""
    why = wrap_up or state.iteration.wrap_up
    system = system_prompt(state)
    if why:
        specs: list[ToolSpec] = []
        messages = model_messages(state, ChatMessage.user(wrap_up_note(why)))
    else:
        specs = tool_specs(state, contracts, progressive_above)
        if any(isinstance(s, ToolSummary) for s in specs):
            system = f"{system}\n{PROGRESSIVE_NOTE}"
        messages = model_messages(state)
    return ModelRequest(
        purpose="plan",
        model=model,
        system=system,
        messages=messages,
        tools=specs,
        max_tokens=max_tokens,
        run_id=state.run_id,
        seq=state.model_calls,
        cache=True,
    )


WRAP_UP_NOTE = (
    "Stop working now: {why}. Tools are no longer available. Write your best final answer to the task "
    "from what you already have, as plain text, and say briefly what is missing or uncertain."
)


def wrap_up_note(reason: str) -> str:
    return WRAP_UP_NOTE.format(why=reason)


def budget_request(state: RunState, req: ModelRequest) -> BudgetRequest:
    """What the governor decides this turn on: ``req``'s sections, and what the run spent.

    History is counted once per message (``history_tokens``), the tools and the goal are small
    and counted from cached texts: the check costs the same at step 80 as at step 10."""
    task = state.messages[0].text() if state.messages else ""
    task_tokens = tokens.count(task)
    history = history_tokens(state.run_id, state.messages)
    return BudgetRequest(
        run_id=state.run_id,
        turn=state.iteration.n,
        model=state.model,
        sections=SectionTokens(
            goal=tokens.count(req.system) + task_tokens,
            history=max(0, history - task_tokens),
            tools=tools_tokens(req.tools),
            output=req.max_tokens,
        ),
        spent=state.usage,
        context_budget_tokens=state.config.context_budget_tokens,
        run_token_budget=state.config.run_token_budget,
        cost_ceiling_usd=state.config.cost_ceiling_usd,
        tenant=state.config.tenant,
        wrap_up=bool(state.iteration.wrap_up),
        delegated_usd=state.delegated_usage.cost_usd,
    )


# --- what the planner tells the model between turns -----------------------------------------

SIMULATED_CALL_NOTE = (
    "Your last reply described a tool call in text. That does not run anything: to call a tool, use the tool interface."
)

LOOP_REFLECTION = (
    "You are repeating yourself: {what}. Repeating it will not change the result. Step back, "
    "review what you have tried, and choose a clearly different approach: different arguments, a different "
    "tool, or answer with what you already have."
)


def unknown_tool(name: str, available: list[str]) -> str:
    return f"There is no tool named '{name}'. Available tools: {', '.join(available)}."


def skipped_result(tool: str, error: str | None) -> str:
    return f"[{tool} skipped] {error} Continue without it and mention in your answer that this information is missing."


def gate_note(approved: bool, note: str) -> str:
    return f"A human {'approved' if approved else 'denied'} this: {note or 'no note'}"


def revision_request(note: str) -> str:
    return f"A reviewer asks for a revision: {note}"


def human_retry(result_text: str | None, note: str) -> str:
    return f"{result_text or ''}\nA human asks you to try again: {note}".strip()


def human_review(result_text: str | None, note: str) -> str:
    return f"{result_text or ''}\nA human reviewed this failure and says: {note or 'continue'}".strip()


def loop_review(note: str) -> str:
    return f"A human reviewed the loop and says: {note or 'try a different approach'}"


def retry_guidance(verdict: Verdict | None, mode: str, terminal: list[str]) -> str:
    """What the retry turn says: the failed criteria and reasons. It never forbids tools."""
    if verdict is None:
        return "Your answer was not accepted. Revise it."
    lines = []
    if verdict.score is not None:
        lines.append(f"A reviewer scored your answer {verdict.score:.2f}; it needs {verdict.threshold:.2f}.")
    else:
        lines.append(f"Your answer could not be scored: {verdict.not_judged_reason}.")
    failed = [c for c in verdict.criteria if not c.passed or c.score < 1.0]
    if failed:
        lines.append("Criteria to improve:")
        lines.extend(
            f"- {c.name} ({c.score:.2f}{', required' if c.hard else ''}): {c.reason or 'not met'}" for c in failed
        )
    lines.extend(f"- {r}" for r in verdict.reasons if r and not any(r.startswith(c.name) for c in failed))
    finish = (
        f"then call {terminal[0]} with the revised answer"
        if mode != "text" and terminal
        else "then reply with the revised answer"
    )
    lines.append(f"Revise the answer to address these points. Use tools again if you need more information, {finish}.")
    return "\n".join(lines)


def synthesis_nudge(mode: str, terminal: list[str]) -> str:
    if mode == "text":
        return "Please write your final answer now, as plain text."
    return f"You have not submitted an answer yet. When you have what you need, call {terminal[0]} with your answer."
