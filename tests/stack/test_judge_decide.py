"""The judge and the Decide step end to end: the seed's five defects, replayed over the bus.

Seed 003: (1) a submission followed by a short confirmation looped 90 times; (2) spent
retries passed an empty output on; (3) the judge threw on every call and a 0.7 fallback
score hid it; (4) criteria the judge could not see made 80 % of drafts retry; (5)
"retry-death": the same 309-character answer was scored three times because a tools-only
turn left the old answer and its score in place.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from loopwarden.client import Client
from loopwarden.fake_model import FakeModel
from shared import subjects as S
from shared.messages import RunSnapshot, RunSubmit, Verdict
from tests.support.runs import GOOD_SEARCH, escalations_of, run_scenario, submit, tool_results
from tests.support.timing import bound
from tests.support.wire import Wire

RUBRIC = {"threshold": 0.8, "criteria": [{"name": "accurate", "weight": 2}, {"name": "cites a source", "hard": True}]}
ANSWER_309 = (
    "JetStream de-duplicates messages by their Nats-Msg-Id header within the stream's duplicate window. "
    "A publisher that retries after a timeout reuses the same id so the server can recognise the second "
    "copy and acknowledge it as a duplicate instead of storing it again; the default window is two minutes long too."
)
assert len(ANSWER_309) == 309


def search(query: str = "dedupe") -> dict[str, Any]:
    return {"name": "search", "input": {"query": query}}


async def verdicts(client: Client, run_id: str) -> list[Verdict]:
    return [Verdict.model_validate(e.payload) for e in await client.events(run_id, subjects=S.JUDGE_VERDICT)]


def judge_requests(wire: Wire, run_id: str) -> list[dict[str, Any]]:
    """The judge requests the stream stored, as the wire relayed them (the planner removes a run's handled commands
    from the stream once the run ended; a publish the stream dropped as a duplicate has a message id seen before)."""
    stored: dict[str, dict[str, Any]] = {}
    for m in wire.seen:
        stored.setdefault(m.headers.get("Nats-Msg-Id", str(len(stored))), json.loads(m.data))
    return [r for r in stored.values() if r["run_id"] == run_id]


def decisions(events: list[Any]) -> list[tuple[int, str]]:
    return [(e.payload["detail"]["row"], e.payload["detail"]["action"]) for e in events if e.kind == "run.decided"]


# --- defect 1: submission loop -----------------------------------------------------------------


async def test_a_short_confirmation_after_submit_result_completes_the_run(client: Client) -> None:
    state = await run_scenario(
        client,
        {
            "name": "d1-submit-then-ok",
            "task": "Answer and submit.",
            "planner": [
                {"tool_calls": [search()]},
                {"text": "ok", "tool_calls": [{"name": "submit_result", "input": {"answer": ANSWER_309}}]},
                {"text": "Done!"},
                {"text": "Done!"},
            ],
            "tools": {"search": [{"output": GOOD_SEARCH}]},
        },
    )
    assert state.status == "completed" and state.final_output == ANSWER_309
    assert state.model_calls == 2  # nothing after the submission: no synthesis turn, no loop
    assert decisions(await client.events(state.run_id)) == [(2, "continue"), (5, "complete")]


async def test_submission_is_read_from_the_tool_call_history_not_from_messages(client: Client) -> None:
    # a failed submit_result call is in the history as failed: the run is not submitted by it
    state = await run_scenario(
        client,
        {
            "name": "d1-failed-submit",
            "task": "Submit.",
            "planner": [
                {"text": "submitting", "tool_calls": [{"name": "submit_result", "input": {"answer": ""}}]},
                submit("the real answer"),
            ],
        },
    )
    assert state.status == "completed" and state.final_output == "the real answer"
    assert tool_results(state)[0].is_error  # minLength 1: not executed
    assert decisions(await client.events(state.run_id)) == [(2, "continue"), (5, "complete")]


# --- defect 2: empty final output ---------------------------------------------------------------


async def test_spent_retries_keep_the_current_answer_never_an_empty_one(client: Client) -> None:
    state = await run_scenario(
        client,
        {
            "name": "d2-retries-spent",
            "task": "Explain dedupe.",
            "answer_mode": "text",
            "planner": [{"text": "first draft"}, {"text": "second draft"}],
            "judge": [
                {"scores": {"accurate": 0.2, "cites a source": 1}},
                {"scores": {"accurate": 0.3, "cites a source": 1}},
            ],
            "rubric": RUBRIC,
            "limits": {"max_judge_retries": 1},
        },
    )
    assert state.status == "completed" and state.passed is False
    assert state.final_output == "second draft"
    assert decisions(await client.events(state.run_id)) == [(3, "retry"), (4, "complete")]


async def test_a_failed_last_turn_falls_back_to_the_last_answer(client: Client) -> None:
    state = await run_scenario(
        client,
        {
            "name": "d2-last-turn-fails",
            "task": "Explain dedupe.",
            "answer_mode": "text",
            "planner": [{"text": "a usable draft"}, {"error": {"type": "fatal", "message": "prefill rejected"}}],
            "judge": [{"scores": {"accurate": 0.5, "cites a source": 1}}],
            "rubric": RUBRIC,
        },
    )
    assert state.status == "failed" and "prefill rejected" in (state.final_reason or "")
    assert state.final_output == "a usable draft"


async def test_the_last_submitted_payload_is_the_final_fallback(client: Client) -> None:
    state = await run_scenario(
        client,
        {
            "name": "d2-payload-fallback",
            "task": "Submit a structured answer.",
            "planner": [{"tool_calls": [{"name": "submit_result", "input": {"answer": "structured", "sources": []}}]}],
            "judge": [{"raw": "cannot decide"}],
            "rubric": RUBRIC,
            "limits": {"not_judged_policy": "fail"},
        },
    )
    assert state.status == "failed"
    assert state.final_output and state.final_output.startswith("structured")


# --- defect 3: the silent judge --------------------------------------------------------------------


async def test_a_judge_exception_is_not_judged_never_a_default_score(client: Client) -> None:
    state = await run_scenario(
        client,
        {
            "name": "d3-judge-raises",
            "task": "Explain.",
            "answer_mode": "text",
            "planner": [{"text": "draft one"}, {"text": "draft two"}],
            "judge": [
                {"error": "int() argument must be a string or a number, not 'NoneType'"},
                {"scores": {"accurate": 0.9, "cites a source": 1}},
            ],
            "rubric": RUBRIC,
            "limits": {"not_judged_policy": "retry"},
        },
    )
    first, second = await verdicts(client, state.run_id)
    assert first.status == "not_judged" and first.score is None
    assert "int() argument" in (first.not_judged_reason or "")
    assert second.status == "passed" and state.status == "completed" and state.final_output == "draft two"
    assert state.first_draft_passed is None  # the first draft was never judged: not judged, not "passed"


async def test_an_unparseable_judge_reply_escalates_by_default(client: Client) -> None:
    state = await run_scenario(
        client,
        {
            "name": "d3-unparseable",
            "task": "Explain.",
            "answer_mode": "text",
            "planner": [{"text": "a draft"}],
            "judge": [{"raw": "Looks fine to me, 7/10"}],
            "rubric": RUBRIC,
        },
        until=("awaiting_human",),
    )
    (verdict,) = await verdicts(client, state.run_id)
    assert verdict.status == "not_judged" and verdict.score is None
    assert "not a JSON object" in (verdict.not_judged_reason or "")
    assert state.passed is None and state.awaiting is not None and state.awaiting.kind == "not_judged"
    (item,) = await escalations_of(client, state.run_id)
    assert (await client.resolve(item.escalation_id, "reviewer", "accept", "read it myself")).ok
    done = await client.wait(state.run_id, timeout=bound(60))
    assert done.status == "completed" and done.final_output == "a draft"


async def test_a_missing_judge_setting_is_not_judged(client: Client) -> None:
    # the judge's provider is configured on its own; a run whose scenario scripts no judge replies
    # leaves the scripted judge with nothing to say: not judged, with the reason
    state = await run_scenario(
        client,
        {
            "name": "d3-no-judge-script",
            "task": "Explain.",
            "answer_mode": "text",
            "planner": [{"text": "a draft"}],
            "rubric": RUBRIC,
            "limits": {"not_judged_policy": "accept"},
        },
    )
    (verdict,) = await verdicts(client, state.run_id)
    assert verdict.status == "not_judged" and "has 0 judge repl(ies)" in (verdict.not_judged_reason or "")
    assert state.status == "completed" and state.passed is None  # accepted, but not reported as passed


# --- defect 4: criteria the judge cannot see ---------------------------------------------------------


async def test_a_criterion_needing_invisible_input_is_refused_when_the_rubric_loads(client: Client) -> None:
    state = await run_scenario(
        client,
        {
            "name": "d4-refused",
            "task": "Check the file.",
            "answer_mode": "text",
            "planner": [{"text": "x"}],
            "rubric": {
                "judge_sees": ["answer"],
                "criteria": [{"name": "세션 ID를 포함할 것", "needs": ["tool_history"]}, {"name": "accurate"}],
            },
        },
    )
    assert state.status == "failed" and state.model_calls == 0
    assert "rubric refused: criterion '세션 ID를 포함할 것' needs tool_history" in (state.final_reason or "")


async def test_a_criterion_worded_around_invisible_input_is_flagged(client: Client) -> None:
    state = await run_scenario(
        client,
        {
            "name": "d4-flagged",
            "task": "Check the file.",
            "answer_mode": "text",
            "planner": [{"text": "ok"}],
            "judge": [{"scores": {"includes the session id": 0.0, "accurate": 1.0}}],
            "rubric": {
                "judge_sees": ["answer"],
                "threshold": 0.4,
                "criteria": [{"name": "includes the session id"}, {"name": "accurate"}],
            },
        },
    )
    assert any("includes the session id" in w and "does not receive" in w for w in state.warnings)
    started = next(e for e in await client.events(state.run_id) if e.kind == "run.started")
    assert started.payload["detail"]["warnings"] == state.warnings


async def test_partial_credit_names_as_written_and_hard_criteria(client: Client) -> None:
    rubric = {
        "threshold": 0.6,
        "criteria": [{"name": "정확성", "weight": 2}, {"name": "간결함"}, {"name": "출처 인용", "hard": True}],
    }
    state = await run_scenario(
        client,
        {
            "name": "d4-partial",
            "task": "Explain.",
            "answer_mode": "text",
            "planner": [{"text": "draft one"}, {"text": "draft two"}],
            "judge": [
                {"scores": {"정확성": 1.0, "간결함": 1.0, "출처 인용": 0.0}, "reasons": {"출처 인용": "URL이 없음"}},
                {"scores": {"정확성": 0.7, "간결함": 0.4, "출처 인용": 1.0}},
            ],
            "rubric": rubric,
        },
    )
    hard_fail, partial = await verdicts(client, state.run_id)
    assert hard_fail.score == 0.0 and "required criteria not met: 출처 인용" in hard_fail.reasons
    assert [c.name for c in hard_fail.criteria] == ["정확성", "간결함", "출처 인용"]
    assert partial.status == "passed" and abs(partial.score - (0.7 * 2 + 0.4 + 1.0) / 4) < 1e-9  # type: ignore[operator]
    retry_turn = state.messages[2]
    guidance = "".join(b.text for b in retry_turn.content if b.type == "text")
    assert "출처 인용 (0.00, required): URL이 없음" in guidance


# --- defect 5: retry-death ----------------------------------------------------------------------------


async def test_retry_death_a_stale_answer_is_never_rescored(client: Client) -> None:
    async with Wire(client, S.JUDGE_SCORE) as wire:
        state = await run_scenario(
            client,
            {
                "name": "d5-retry-death",
                "task": "Explain JetStream de-duplication.",
                "answer_mode": "text",
                "planner": [
                    {"text": ANSWER_309},  # iteration 1: a candidate, scored 0.30 -> retry
                    {"tool_calls": [search("jetstream dedupe window")]},  # iteration 2: tools only, no text
                    {"tool_calls": [search("nats-msg-id")]},  # iteration 3: tools only, no text
                    {"text": ANSWER_309 + " Source: https://docs.nats.io/x"},  # iteration 4: a fresh candidate
                ],
                "judge": [
                    {"scores": {"accurate": 0.3, "cites a source": 0.3}, "reasons": {"cites a source": "no URL"}},
                    {"scores": {"accurate": 0.95, "cites a source": 1.0}},
                ],
                "tools": {"search": [{"output": GOOD_SEARCH, "times": 2}]},
                "rubric": RUBRIC,
                "limits": {"max_judge_retries": 3},
            },
        )
    assert state.status == "completed" and state.passed is True
    requests = judge_requests(wire, state.run_id)
    assert [r["candidate"]["iteration"] for r in requests] == [1, 4]  # each candidate judged once
    assert [len(r["candidate"]["content"]) for r in requests] == [309, 309 + 31]
    assert [v.candidate_id for v in await verdicts(client, state.run_id)] == [r["candidate"]["id"] for r in requests]
    assert state.retry_count == 1 and state.continue_count == 2  # tool turns spent no retries
    assert decisions(await client.events(state.run_id)) == [
        (3, "retry"),
        (2, "continue"),
        (2, "continue"),
        (7, "complete"),
    ]


async def test_retry_guidance_carries_the_reasons_and_allows_tools(client: Client) -> None:
    state = await run_scenario(
        client,
        {
            "name": "d5-guidance",
            "task": "Explain.",
            "planner": [
                submit("thin answer"),
                {"tool_calls": [search()]},
                submit("better answer, https://docs.nats.io/x"),
            ],
            "judge": [
                {
                    "scores": {"accurate": 0.4, "cites a source": 0.0},
                    "reasons": {"accurate": "misses the window length", "cites a source": "no source"},
                },
                {"scores": {"accurate": 0.9, "cites a source": 1.0}},
            ],
            "tools": {"search": [{"output": GOOD_SEARCH}]},
            "rubric": RUBRIC,
        },
    )
    assert state.status == "completed" and state.first_draft_passed is False
    retry_turn = state.messages[2]
    assert retry_turn.content[0].type == "tool_result"  # the submission's receipt is answered, then guidance
    guidance = "".join(b.text for b in retry_turn.content if b.type == "text")
    assert "accurate (0.40): misses the window length" in guidance
    assert "cites a source (0.00, required): no source" in guidance
    assert "Use tools again if you need more information" in guidance
    assert "not re-research" not in guidance.lower() and "do not use" not in guidance.lower()


async def test_judge_model_is_configured_apart_from_the_planner(client: Client) -> None:
    state = await run_scenario(
        client,
        {
            "name": "independent-judge",
            "task": "Explain.",
            "answer_mode": "text",
            "planner": [{"text": "x"}],
            "judge": [{"scores": {"accurate": 1, "cites a source": 1}}],
            "rubric": RUBRIC,
        },
    )
    (verdict,) = await verdicts(client, state.run_id)
    assert verdict.judge_model == "claude-haiku-4-5" and state.model == "claude-sonnet-4-6"


async def test_lessons_from_earlier_runs_are_opt_in(client: Client, messages_api: FakeModel) -> None:
    """A live judge's reasons are a lesson for the tenant's later runs of the task (opt-in); a scripted run's
    verdicts are what its submitter wrote, and never one (security review 4, N3)."""
    key = f"lessons{uuid.uuid4().hex[:8]}"
    task = f"Explain JetStream dedupe (lessons test). [script:{key}]"
    messages_api.script(
        key,
        [
            {"content": [{"type": "text", "text": "vague"}]},
            {"content": [{"type": "text", "text": judge_reply(0.2, 0.0, "names no URL")}]},
            {"content": [{"type": "text", "text": "x"}]},
            {"content": [{"type": "text", "text": judge_reply(1.0, 1.0)}]},
            {"content": [{"type": "text", "text": "precise, with a URL"}]},
            {"content": [{"type": "text", "text": judge_reply(1.0, 1.0)}]},
        ],
    )
    live = {"task": task, "answer_mode": "text", "rubric": RUBRIC, "limits": {"max_judge_retries": 0}, "tools": []}
    first = await submit_live(client, live)
    assert first.first_draft_passed is False
    without = await submit_live(client, live)
    assert "Lessons" not in without.messages[0].text()
    second = await submit_live(client, {**live, "lessons": True})
    opening = second.messages[0].text()
    assert "Lessons from earlier attempts" in opening and "cites a source: names no URL" in opening
    assert second.first_draft_passed is True and second.retry_count == 0
    # a scripted run's failing verdict: its reason reaches no later run
    scripted_task = "Explain JetStream dedupe (scripted lessons test)."
    base = {"name": "lessons", "task": scripted_task, "answer_mode": "text", "rubric": RUBRIC}
    judged = {"scores": {"accurate": 0.2, "cites a source": 0.0}, "reasons": {"cites a source": "SUBMITTER-WORDS"}}
    failed = await run_scenario(
        client, {**base, "limits": {"max_judge_retries": 0}, "planner": [{"text": "vague"}], "judge": [judged]}
    )
    assert failed.first_draft_passed is False
    after = await run_scenario(
        client,
        {
            **base,
            "lessons": True,
            "planner": [{"text": "y"}],
            "judge": [{"scores": {"accurate": 1, "cites a source": 1}}],
        },
    )
    assert "SUBMITTER-WORDS" not in after.messages[0].text() and "Lessons" not in after.messages[0].text()


def judge_reply(accurate: float, source: float, why: str = "") -> str:
    return json.dumps({"scores": {"accurate": accurate, "cites a source": source}, "reasons": {"cites a source": why}})


async def submit_live(client: Client, fields: dict[str, Any]) -> RunSnapshot:
    run_id = f"run-{uuid.uuid4().hex[:16]}"
    await client.submit(RunSubmit(run_id=run_id, **fields))
    state = await client.wait(run_id, timeout=bound(60))
    assert state.status == "completed", state.final_reason
    return state


async def test_answer_modes_text_submission_or_either(client: Client) -> None:
    text_answer = [{"tool_calls": [search()]}, {"text": "JetStream drops repeated Nats-Msg-Ids."}]
    tools = {"search": [{"output": GOOD_SEARCH}]}
    auto = await run_scenario(client, {"name": "auto-text", "task": "t", "planner": text_answer, "tools": tools})
    assert auto.status == "completed" and auto.final_output == "JetStream drops repeated Nats-Msg-Ids."
    assert auto.submitted is False  # answered, but nothing was submitted through the terminal tool
    assert decisions(await client.events(auto.run_id))[-1] == (7, "complete")
    strict = await run_scenario(
        client,
        {
            "name": "submit-only",
            "task": "t",
            "answer_mode": "submit",
            "planner": [*text_answer, submit("JetStream drops repeated ids.")],
            "tools": tools,
        },
    )
    assert strict.status == "completed" and strict.submitted is True
    assert [r for r, _ in decisions(await client.events(strict.run_id))] == [2, 6, 5]  # text was not an answer
    completed = next(e for e in await client.events(strict.run_id) if e.kind == "run.completed")
    assert completed.payload["detail"]["submitted"] is True
