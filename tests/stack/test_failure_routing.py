"""Failure routing end to end: each failure type takes its own path, chosen by subscription."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from typing import Any

import pytest
from nats.js.api import ConsumerConfig, DeliverPolicy

from loopwarden.client import Client, tool_metrics
from loopwarden.stack import LocalStack
from shared import subjects as S
from shared.messages import escalation_id_for_call
from shared.scenario import parse_scenario
from tests.support.otlp_collector import OtlpCollector
from tests.support.paths import ROOT
from tests.support.payments import count_charges
from tests.support.runs import GOOD_SEARCH, escalations_of, run_scenario, submit, tool_results
from tests.support.timing import bound, polls
from tests.support.tracing import spans_of_run


def attempts(events: list[Any], tool: str) -> list[dict[str, Any]]:
    return [e.payload for e in events if e.kind == f"tool.attempt.{tool}"]


async def test_two_503s_then_success_are_absorbed_by_the_executor(client: Client, otlp: OtlpCollector) -> None:
    state = await run_scenario(
        client,
        {
            "name": "503-twice",
            "task": "Search for dedupe.",
            "planner": [{"tool_calls": [{"name": "search", "input": {"query": "dedupe"}}]}, submit("done")],
            "tools": {
                "search": [
                    {"fail": "transient", "error": "HTTP 503 Service Unavailable", "times": 2},
                    {"output": GOOD_SEARCH},
                ]
            },
        },
    )
    assert state.status == "completed"
    assert state.model_calls == 2  # no model involvement in the retries
    assert not tool_results(state)[0].is_error
    events = await client.events(state.run_id)
    tried = attempts(events, "search")  # the failed ones; the third is counted in the outcome
    assert [(a["attempt"], a["ok"]) for a in tried] == [(1, False), (2, False)]
    assert all(a["next_delay_s"] is not None for a in tried)
    assert [e.payload["attempts"] for e in events if e.kind == "tool.succeeded.search"] == [3]
    counted = tool_metrics(events)["search"]
    assert (counted["attempts"], counted["retried_attempts"]) == (3, 2)
    spans = await spans_of_run(otlp, client, state.run_id, {"loopwarden-executor"})
    tries = sorted(
        (s for s in spans if s.name == "tool attempt search"), key=lambda s: s.attributes["loopwarden.tool.attempt"]
    )
    for _ in range(polls(50)):  # the last attempt's span may still be in the export queue
        if len(tries) == 3:
            break
        await asyncio.sleep(0.1)
        tries = sorted(
            (s for s in otlp.trace(spans[0].trace_id) if s.name == "tool attempt search"),
            key=lambda s: s.attributes["loopwarden.tool.attempt"],
        )
    assert [s.attributes["loopwarden.tool.attempt"] for s in tries] == [1, 2, 3]
    assert [("loopwarden.tool.backoff_s" in s.attributes) for s in tries] == [True, True, False]
    assert [s.attributes.get("loopwarden.failure.type") for s in tries] == ["transient", "transient", None]


async def test_retry_after_is_honoured(client: Client) -> None:
    state = await run_scenario(
        client,
        {
            "name": "retry-after",
            "task": "Search.",
            "planner": [{"tool_calls": [{"name": "search", "input": {"query": "dedupe"}}]}, submit("done")],
            "tools": {
                "search": [{"fail": "transient", "error": "HTTP 429", "retry_after_s": 0.6}, {"output": GOOD_SEARCH}]
            },
        },
    )
    tried = attempts(await client.events(state.run_id), "search")
    assert tried[0]["next_delay_s"] >= 0.6


async def test_a_tool_that_always_fails_falls_back(client: Client) -> None:
    state = await run_scenario(
        client,
        {
            "name": "fallback",
            "task": "How many pending orders?",
            "planner": [
                {
                    "tool_calls": [
                        {
                            "name": "sql_query",
                            "input": {"query": "select count(*) as n from orders where status='pending'"},
                        }
                    ]
                },
                submit("One pending order."),
            ],
            "tools": {"sql_query": [{"fail": "transient", "error": "connection refused", "times": "always"}]},
        },
    )
    assert state.status == "completed", state.final_reason
    result = tool_results(state)[0]
    assert not result.is_error
    assert "'sql_query' failed" in result.content and "fallback tool 'readonly_cache'" in result.content
    assert '"source":"snapshot"' in result.content.replace(" ", "") and '"n":1' in result.content.replace(" ", "")
    events = await client.events(state.run_id)
    assert len(attempts(events, "sql_query")) == 3  # its own retry policy first
    assert attempts(events, "readonly_cache") == []  # its one attempt returned the output: no event of its own
    assert [e.payload["attempts"] for e in events if e.kind == "tool.succeeded.readonly_cache"] == [1]


async def test_skip_and_note_boundary(client: Client) -> None:
    state = await run_scenario(
        client,
        {
            "name": "skip",
            "task": "Profile ACME.",
            "planner": [
                {"tool_calls": [{"name": "enrich_company", "input": {"company": "acme"}}]},
                submit("ACME profile (enrichment unavailable)."),
            ],
            "tools": {"enrich_company": [{"fail": "timeout", "error": "upstream 30s timeout", "times": "always"}]},
        },
    )
    assert state.status == "completed"
    result = tool_results(state)[0]
    assert not result.is_error and result.content.startswith("[enrich_company skipped]")
    assert "Continue without it" in result.content


async def test_use_cached_boundary(client: Client) -> None:
    args = {"base": "gbp", "quote": "jpy"}
    state = await run_scenario(
        client,
        {
            "name": "cached",
            "task": "GBP to JPY, twice.",
            "planner": [
                {"tool_calls": [{"name": "exchange_rate", "input": args}]},
                {"tool_calls": [{"name": "exchange_rate", "input": args}]},
                submit("about 192"),
            ],
            "tools": {
                "exchange_rate": [{"latency_s": 0}, {"fail": "transient", "error": "rates API down", "times": "always"}]
            },
        },
    )
    assert state.status == "completed", state.final_reason
    live, cached = tool_results(state)[:2]
    assert not cached.is_error and "served from cache and possibly stale" in cached.content
    assert json.loads(cached.content.splitlines()[-1]) == json.loads(live.content)


async def test_ask_human_boundary_waits_for_a_person(client: Client) -> None:
    run_id = await client.submit_scenario(
        parse_scenario(
            {
                "name": "ask-human",
                "task": "Charge cus_ada1 12.00 USD.",
                "planner": [
                    {
                        "tool_calls": [
                            {
                                "name": "charge_card",
                                "id": "toolu_pay",
                                "input": {"customer_id": "cus_ada1", "amount_cents": 1200, "currency": "usd"},
                            }
                        ]
                    },
                    submit("Charged by hand: ch_manual_1."),
                ],
                "tools": {"charge_card": [{"fail": "transient", "error": "payment gateway 503", "times": "always"}]},
            }
        )
    )
    state = await client.wait(run_id, timeout=bound(60), until=("awaiting_human",))
    assert state.awaiting is not None and state.awaiting.kind == "ask_human"
    assert [e.escalation_id for e in await escalations_of(client, run_id)] == [state.awaiting.escalation_id]
    result = {"status": "charged", "charge_id": "ch_manual_1", "amount_cents": 1200}
    reply = await client.resolve(state.awaiting.escalation_id, "finance", "provide_result", result=result)
    assert reply.ok, reply.error
    state = await client.wait(run_id, timeout=bound(60))
    assert state.status == "completed"
    assert json.loads(tool_results(state)[0].content) == result


async def test_a_fatal_error_reaches_the_queue_through_its_subscription(client: Client) -> None:
    info_before = await client.bus.js.consumer_info(S.STREAM_EVT, "escalation_failures")
    run_id = await client.submit_scenario(
        parse_scenario(
            {
                "name": "fatal",
                "task": "Read orders.",
                "planner": [
                    {"tool_calls": [{"name": "sql_query", "id": "toolu_fatal", "input": {"query": "select 1"}}]}
                ],
                "tools": {"sql_query": [{"fail": "fatal", "error": "permission denied for table orders"}]},
            }
        )
    )
    state = await client.wait(run_id, timeout=bound(60), until=("awaiting_human",))
    esc_id = escalation_id_for_call(run_id, 1, "toolu_fatal")
    assert state.awaiting is not None and state.awaiting.escalation_id == esc_id
    items = await escalations_of(client, run_id)
    assert [(e.kind, e.tool) for e in items] == [("fatal", "sql_query")]
    assert "permission denied" in items[0].reason and "cannot be retried" in items[0].reason
    # it arrived by the escalation service's own subscription to failure.fatal.> ...
    info_after = await client.bus.js.consumer_info(S.STREAM_EVT, "escalation_failures")
    assert info_after.delivered.stream_seq > info_before.delivered.stream_seq
    # ... not by a raise command from the planner
    raised = await client.events(subjects=S.ESCALATION_RAISE)
    assert not [e for e in raised if e.payload.get("escalation_id") == esc_id]
    tried = attempts(await client.events(run_id), "sql_query")
    assert len(tried) == 1  # fatal: not retried
    # a person claims it; nobody else can take it over or resolve it
    assert (await client.claim(esc_id, "dba")).ok
    taken = await client.claim(esc_id, "intern")
    assert not taken.ok and "claimed by dba" in (taken.error or "")
    assert not (await client.resolve(esc_id, "intern", "resume")).ok
    assert (await client.resolve(esc_id, "dba", "abort", "no access")).ok
    done = await client.wait(run_id, timeout=bound(60))
    assert done.status == "stopped" and "aborted by dba: no access" in (done.final_reason or "")
    again = await client.resolve(esc_id, "dba", "resume")
    assert not again.ok and "already resolved" in (again.error or "")


async def test_a_new_consumer_of_one_tools_transient_failures_is_just_a_subscription(client: Client) -> None:
    name = f"audit_enrich_{int(time.time() * 1000)}"
    await client.bus.js.add_consumer(
        S.STREAM_EVT,
        ConsumerConfig(
            durable_name=name,
            filter_subject=S.any_run(S.failure("transient", "enrich_company")),
            deliver_policy=DeliverPolicy.NEW,
        ),
    )
    sub = await client.bus.js.pull_subscribe_bind(name, stream=S.STREAM_EVT)
    try:
        state = await run_scenario(
            client,
            {
                "name": "two-transients",
                "task": "Enrich and search.",
                "planner": [
                    {
                        "tool_calls": [
                            {"name": "enrich_company", "input": {"company": "globex"}},
                            {"name": "search", "input": {"query": "dedupe"}},
                        ]
                    },
                    submit("ok"),
                ],
                "limits": {"max_iterations": 3},
                "tools": {
                    "enrich_company": [{"fail": "transient", "error": "HTTP 502", "times": "always"}],
                    "search": [{"fail": "transient", "error": "HTTP 503", "times": "always"}],
                },
            },
        )
        msgs = await sub.fetch(10, timeout=bound(2))
        seen = [(m.subject, json.loads(m.data)["run_id"]) for m in msgs]
        assert (S.run_scoped(S.failure("transient", "enrich_company"), state.run_id), state.run_id) in seen
        assert all(S.stem(subject) == S.failure("transient", "enrich_company") for subject, _ in seen)
    finally:
        await client.bus.js.delete_consumer(S.STREAM_EVT, name)


async def test_an_identical_call_loop_gets_a_reflection_then_stops(client: Client) -> None:
    same = {"tool_calls": [{"name": "calculator", "input": {"expression": "2+2"}}]}
    state = await run_scenario(
        client,
        {
            "name": "loop",
            "task": "What is 2+2?",
            "planner": [same] * 6,
            "limits": {"max_iterations": 10},
        },
    )
    assert state.status == "stopped" and "loop persisted" in (state.final_reason or "")
    results = tool_results(state)
    ran = [r for r in results if not r.is_error]
    assert len(ran) == 2  # the third identical call was not executed
    assert results[2].is_error and "You are repeating yourself" in results[2].content
    assert state.model_calls == 4  # a reflection, one more try, then the run stops — bounded
    kinds = [e.kind for e in await client.events(state.run_id)]
    assert kinds.count("failure.loop.calculator") == 2


async def test_a_persistent_loop_can_escalate_instead(client: Client) -> None:
    same = {"tool_calls": [{"name": "calculator", "input": {"expression": "3*3"}}]}
    state = await run_scenario(
        client,
        {
            "name": "loop-escalate",
            "task": "3*3?",
            "planner": [same] * 5,
            "limits": {"loop_policy": "escalate", "max_iterations": 10},
        },
        until=("awaiting_human",),
    )
    assert state.awaiting is not None and state.awaiting.kind == "loop"


async def test_alternation_and_repeated_errors_are_loops_too(client: Client) -> None:
    a = {"name": "calculator", "input": {"expression": "1+1"}}
    b = {"name": "calculator", "input": {"expression": "2+2"}}
    state = await run_scenario(
        client,
        {
            "name": "abab",
            "task": "x",
            "limits": {"max_iterations": 10},
            "planner": [
                {"tool_calls": [a]},
                {"tool_calls": [b]},
                {"tool_calls": [a]},
                {"tool_calls": [b]},
                submit("4"),
            ],
        },
    )
    assert "alternating" in tool_results(state)[3].content
    state = await run_scenario(
        client,
        {
            "name": "same-error",
            "task": "y",
            "limits": {"max_iterations": 10},
            "planner": [{"tool_calls": [{"name": "search", "input": {"query": f"query {i}"}}]} for i in range(3)]
            + [submit("nothing found")],
            "tools": {"search": [{"fail": "transient", "error": "HTTP 503", "times": "always"}]},
        },
    )
    last_turn = state.messages[6]
    assert any(b.type == "text" and "the same error from 'search' 3 times" in b.text for b in last_turn.content)


async def test_repeated_errors_escalate_under_the_escalate_loop_policy(client: Client) -> None:
    """One loop reaction (issue 12): the repeated-error loop used to stop under "stop" and do nothing
    at all under "escalate"."""
    state = await run_scenario(
        client,
        {
            "name": "same-error-escalate",
            "task": "y",
            "limits": {"max_iterations": 12, "loop_policy": "escalate"},
            "planner": [{"tool_calls": [{"name": "search", "input": {"query": f"query {i}"}}]} for i in range(8)],
            "tools": {"search": [{"fail": "transient", "error": "HTTP 503", "times": "always"}]},
        },
        until=("awaiting_human",),
    )
    assert state.awaiting is not None and state.awaiting.kind == "loop"
    loops = [e for e in await client.events(state.run_id) if e.kind.startswith("failure.loop")]
    assert [e.payload["detail"]["pattern"] for e in loops] == ["repeated_error", "repeated_error"]


async def test_a_budget_request_the_governor_refuses_fails_the_run_with_its_reason(client: Client) -> None:
    """The governor answers a request it cannot serve with a typed ErrorReply; the planner reads it and
    fails the run naming the reason (it used to expect a BudgetDecision and dead-letter the advance)."""
    run_id = "refused-" + os.urandom(4).hex()
    budgets = await client.bus.kv(S.KV_BUDGETS)
    await budgets.put(S.kv_key(run_id), b"{not a budget ledger")  # the governor cannot read this run's ledger
    scenario = parse_scenario({"name": "governor-refuses", "task": "2+2?", "planner": [submit("4")]})
    await client.submit_scenario(scenario, run_id=run_id)
    state = await client.wait(run_id, timeout=bound(30))
    assert state.status == "failed" and state.model_calls == 0
    assert (state.final_reason or "").startswith("the governor refused the budget request: handler failed"), (
        state.final_reason
    )
    letters = [d for d in await client.dead_letters() if run_id in d.body]
    assert [(d.service, d.subject) for d in letters] == [("governor", S.BUDGET_RESERVE)]
    assert not [d for d in letters if d.service == "planner"]  # the advance was not dead-lettered


async def test_in_text_mode_a_tool_call_written_as_text_is_not_the_answer(client: Client) -> None:
    written = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
    state = await run_scenario(
        client,
        {
            "name": "text-mode-written-call",
            "task": "What is 6*7?",
            "answer_mode": "text",
            "planner": [{"text": written}, {"text": "42"}],
        },
    )
    assert state.status == "completed" and state.final_output == "42" and state.model_calls == 2
    kinds = [e.kind for e in await client.events(state.run_id)]
    assert "run.simulated_call" in kinds


async def test_a_tool_call_described_in_text_is_not_a_call(client: Client) -> None:
    state = await run_scenario(
        client,
        {
            "name": "simulated",
            "task": "Submit 42.",
            "planner": [{"text": 'I have called submit_result({"answer": "42"}). Done.'}, submit("42")],
        },
    )
    assert state.status == "completed" and state.final_output == "42"
    assert state.model_calls == 2  # the text claim did not end the run
    nudge = state.messages[2]
    assert any("described a tool call in text" in b.text for b in nudge.content if b.type == "text")
    kinds = [e.kind for e in await client.events(state.run_id)]
    assert "run.simulated_call" in kinds
    decided = [e.payload["detail"]["row"] for e in await client.events(state.run_id) if e.kind == "run.decided"]
    assert decided == [6, 5]


async def test_max_iterations_is_enforced(client: Client) -> None:
    turns = [{"tool_calls": [{"name": "calculator", "input": {"expression": f"{i}+1"}}]} for i in range(10)]
    state = await run_scenario(
        client, {"name": "cap", "task": "count", "planner": turns, "limits": {"max_iterations": 3}}
    )
    assert state.status == "stopped" and "max iterations (3) reached" in (state.final_reason or "")
    assert state.model_calls == 3


async def test_the_cost_ceiling_is_enforced(client: Client) -> None:
    state = await run_scenario(
        client,
        {
            "name": "ceiling",
            "task": "spend",
            "planner": [
                {
                    "tool_calls": [{"name": "calculator", "input": {"expression": "1+1"}}],
                    "usage": {"input_tokens": 100_000, "output_tokens": 1_000},
                },  # ~$0.315 at sonnet prices
                {"tool_calls": [{"name": "calculator", "input": {"expression": "2+2"}}]},
                submit("4"),
            ],
            "limits": {"cost_ceiling_usd": 0.2},
        },
    )
    assert state.status == "stopped" and "cost ceiling" in (state.final_reason or "")
    assert state.model_calls == 1 and state.usage.cost_usd > 0.2


# --- a process dies in the middle of a call --------------------------------------------------------

TOOLS_DIR = ROOT / "tests" / "tools"


async def charges(client: Client, run_id: str) -> int:
    return await count_charges(client.bus.js, run_id)


@pytest.mark.parametrize(("tool", "idempotent"), [("transfer_funds", False), ("sync_ledger", True)])
async def test_killing_the_executor_mid_call(stack: LocalStack, client: Client, tool: str, idempotent: bool) -> None:
    env = {"LW_TOOL_CONTRACT_DIR": str(TOOLS_DIR), "LW_EXECUTOR_TOOLS": tool}
    first = stack.start_service("executor", label=f"executor-{tool}-1", extra_env=env)
    stack.wait_ready([first])
    args = {"customer_id": "cus_kill1", "amount_cents": 500, "currency": "eur"}
    run_id = await client.submit_scenario(
        parse_scenario(
            {
                "name": f"kill-{tool}",
                "task": "Move 5 EUR.",
                "planner": [{"tool_calls": [{"name": tool, "id": "toolu_money", "input": args}]}, submit("moved")],
                # the real tool runs (the money moves), then the response is slow: the process dies in between
                "tools": {tool: [{"latency_s": 30}, {"latency_s": 0}]},
            }
        )
    )
    for _ in range(polls(200)):
        if await charges(client, run_id) == 1:
            break
        await asyncio.sleep(0.05)
    assert await charges(client, run_id) == 1
    os.kill(first.popen.pid, signal.SIGKILL)
    first.popen.wait()
    second = stack.start_service("executor", label=f"executor-{tool}-2", extra_env=env)
    try:
        stack.wait_ready([second])
        if idempotent:
            state = await client.wait(run_id, timeout=bound(60))
            assert state.status == "completed"
            assert await charges(client, run_id) == 2  # safe to run again, and it was
            return
        state = await client.wait(run_id, timeout=bound(60), until=("awaiting_human",))
        assert state.awaiting is not None and state.awaiting.kind == "unknown_outcome"
        assert await charges(client, run_id) == 1  # not run a second time
        items = await escalations_of(client, run_id)
        assert [e.kind for e in items] == ["unknown_outcome"]
        assert "may or may not have completed" in items[0].reason
        done = await client.resolve(
            items[0].escalation_id,
            "finance",
            "provide_result",
            result={"status": "charged", "charge_id": "ch_checked", "amount_cents": 500},
        )
        assert done.ok
        state = await client.wait(run_id, timeout=bound(60))
        assert state.status == "completed"
        assert await charges(client, run_id) == 1
    finally:
        second.popen.terminate()
        second.popen.wait(bound(15))


async def test_a_call_id_reused_in_a_later_turn_is_a_new_call(client: Client) -> None:
    state = await run_scenario(
        client,
        {
            "name": "reused-ids",
            "task": "Two sums.",
            "planner": [
                {"tool_calls": [{"name": "calculator", "id": "t1", "input": {"expression": "1+1"}}]},
                {"tool_calls": [{"name": "calculator", "id": "t1", "input": {"expression": "2+2"}}]},
                {"tool_calls": [{"name": "submit_result", "id": "t1", "input": {"answer": "2 and 4"}}]},
            ],
        },
    )
    assert state.status == "completed", state.final_reason
    assert [json.loads(r.content).get("result") for r in tool_results(state)[:2]] == [2, 4]
