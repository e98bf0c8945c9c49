"""A step's cost does not grow with the run's length (issue 8).

The conversation a turn sends is what the previous turn sent plus what the run appended since:
the same message objects, built by looking only at the new messages. That holds after a
compaction too, whose summary makes the first two user turns one merged message: built anew every
turn, that message was a new object each time, and the scripted provider's per-run meter (which
goes by identity) counted, rendered and hashed the whole conversation again at every turn until
the next compaction (measured: planner CPU per step 2.7 ms at steps 100-150, 5.1 ms at 500-600 of
one run that compacted at step ~370).
"""

from __future__ import annotations

from services.planner import context as C
from services.planner.state import Iteration, RunState
from services.planner.turns import apply_compaction
from shared.messages import ChatMessage, TextBlock, ToolResultBlock, ToolUseBlock, Usage
from shared.providers.scripted import TurnMeter, request_tokens
from tests.support.transitions import run_config


def state(turns: int) -> RunState:
    cfg = run_config(
        max_iterations=1000,
        cost_ceiling_usd=100,
        run_token_budget=10_000_000,
        context_budget_tokens=100_000,
        keep_recent_turns=4,
    )
    s = RunState(
        run_id=f"run-growth-{turns}",
        task="Add the numbers.",
        config=cfg,
        iteration=Iteration(n=1),
        messages=[ChatMessage.user("Add the numbers one by one. " * 20)],
    )
    for k in range(turns):
        s.messages.extend(turn(k))
    return s


def turn(k: int) -> list[ChatMessage]:
    """One step as the planner appends it: the model's tool call, then the tool's result."""
    return [
        ChatMessage(
            role="assistant",
            content=[TextBlock(text=f"step {k}"), ToolUseBlock(id=f"t{k}", name="calculator", input={"e": f"{k}+1"})],
        ),
        ChatMessage(role="user", content=[ToolResultBlock(tool_use_id=f"t{k}", content=str(k + 1))]),
    ]


def whole(messages: list[ChatMessage]) -> list[ChatMessage]:
    """The conversation merged from scratch (consecutive turns of one role as one), as sent before."""
    merged: list[ChatMessage] = []
    for m in messages:
        if merged and merged[-1].role == m.role:
            merged[-1] = ChatMessage(role=m.role, content=[*merged[-1].content, *m.content])
        else:
            merged.append(m)
    if merged and merged[-1].role == "assistant":
        merged.append(ChatMessage.user("Continue."))
    return merged


def compacted(s: RunState) -> RunState:
    older, _ = C.split_for_compaction(s.messages, s.config.keep_recent_turns)
    apply_compaction(s, len(older), "The numbers so far add up.", Usage())
    assert s.compactions == 1 and s.messages[0].role == s.messages[1].role == "user"  # merged when sent
    return s


def test_the_conversation_sent_is_the_whole_merge_and_keeps_the_objects_it_sent_before() -> None:
    for s in (state(3), compacted(state(12))):
        before: list[ChatMessage] = []
        for k in range(30):
            sent = C.model_messages(s)
            assert sent == whole(s.messages)
            # everything but the last message sent before is the very same object now
            assert all(a is b for a, b in zip(sent, before[:-1], strict=False)), k
            before = sent
            s.messages.extend(turn(100 + k))
            if k == 10:  # a step whose results came in two user turns (merged), and one ending on an assistant turn
                s.messages.append(ChatMessage.user("A note."))
            if k == 20:
                s.messages.append(ChatMessage(role="assistant", content=[TextBlock(text="thinking")]))
                assert C.model_messages(s) == whole(s.messages)
                s.messages.append(ChatMessage.user("Go on."))


def test_a_wrap_up_note_a_reload_and_a_second_compaction_are_sent_as_the_whole_merge() -> None:
    s = compacted(state(12))
    C.model_messages(s)
    note = ChatMessage.user("Stop now.")
    assert C.model_messages(s, note) == whole([*s.messages, note])  # merged into the last user turn
    s.messages.extend(turn(50))
    assert C.model_messages(s) == whole(s.messages)
    s.messages = [m.model_copy(deep=True) for m in s.messages]  # read back from KV: equal, new objects
    assert C.model_messages(s) == whole(s.messages)
    for k in range(8):
        s.messages.extend(turn(60 + k))
    older, _ = C.split_for_compaction(s.messages, s.config.keep_recent_turns)
    apply_compaction(s, len(older), "Later summary.", Usage())
    assert C.model_messages(s) == whole(s.messages)
    s.messages.extend(turn(70))
    assert C.model_messages(s) == whole(s.messages)


def test_after_a_compaction_the_turn_meter_counts_only_what_each_turn_added() -> None:
    """The scripted provider's meter keeps a run's measured head while its first and last messages
    are the same objects; a new head object makes it measure the whole conversation again."""
    s = compacted(state(12))
    meter = TurnMeter()
    kept_before = None
    for k in range(40):
        req = C.model_request(s, {}, s.config.model, 100)
        counted, kept = meter.input_tokens(req)
        assert counted == request_tokens(req)
        assert kept is not None and kept.length == len(req.messages) - 1
        if kept_before is not None:
            assert kept is kept_before, f"turn {k}: the whole conversation was measured again"
        kept_before = kept
        s.messages.extend(turn(200 + k))
