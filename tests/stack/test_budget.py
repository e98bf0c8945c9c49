"""Token and cost budgets end to end: warn, compact, then stop; fallback model; inflated tool output."""

from __future__ import annotations

from loopwarden.client import Client
from shared import tokens
from tests.support.runs import budget_layers, run_scenario, submit, tool_results, worded_calc
from tests.support.timing import bound


async def budget_events(client: Client, run_id: str) -> list[str]:
    return [e.kind for e in await client.events(run_id) if e.kind.startswith("budget.")]


async def test_thresholds_warn_then_compact_then_stop(client: Client) -> None:
    state = await run_scenario(
        client,
        budget_layers("budget-layers"),
        timeout=bound(60),
    )
    kinds = await budget_events(client, state.run_id)
    assert "budget.warn" in kinds and "budget.compact" in kinds and "budget.block" in kinds
    assert kinds.index("budget.warn") < kinds.index("budget.block")
    assert kinds.count("budget.warn") == 1 and kinds.count("budget.block") == 1  # each fires once
    assert state.status == "stopped" and "run token budget" in (state.final_reason or "")
    assert state.compactions >= 1
    assert any("Summary of earlier work" in b.text for m in state.messages for b in m.content if b.type == "text")
    assert state.usage.input_tokens + state.usage.output_tokens <= 40_000  # stopped before overrunning


async def test_compaction_keeps_recent_turns_verbatim_and_shrinks_the_context(client: Client) -> None:
    state = await run_scenario(
        client,
        {
            "name": "compaction",
            "task": "Work, then submit.",
            "planner": [worded_calc(i) for i in range(8)] + [submit("done")],
            "summaries": ["Eight steps of arithmetic; results were 7, 1007, 2007 and so on."],
            "limits": {"max_iterations": 20, "context_budget_tokens": 3000},
            # its tools named: a tool another test left on this stack would grow the tools section (the
            # budget counts it) past what compaction can win back
            "allowed_tools": ["calculator"],
        },
        timeout=bound(60),
    )
    assert state.status == "completed", state.final_reason
    assert state.compactions >= 1 and state.summary
    assert "Step 7:" in str(state.messages[-3].model_dump()) or "Step 7:" in str(state.messages[-4].model_dump())
    inputs = [
        e.payload["detail"]["input_tokens"] for e in await client.events(state.run_id) if e.kind == "run.model_called"
    ]
    peak_before = max(inputs[:-2])
    assert inputs[-1] < peak_before  # the summary replaced older turns


async def test_a_token_inflating_tool_is_truncated_in_context(client: Client) -> None:
    huge = {
        "status": "success",
        "totalCount": 1,
        "results": [{"title": "big", "url": "https://x.y/z", "snippet": "lorem ipsum dolor sit amet " * 4000}],
    }
    state = await run_scenario(
        client,
        {
            "name": "inflating-tool",
            "task": "Search.",
            "planner": [{"tool_calls": [{"name": "search", "input": {"query": "anything"}}]}, submit("ok")],
            "tools": {"search": [{"output": huge}]},
        },
    )
    result = tool_results(state)[0]
    assert tokens.count(result.content) < 2100  # the default cap is 2000 tokens
    assert "result truncated" in result.content and "more tokens were cut" in result.content


async def test_cost_pressure_switches_to_the_fallback_model(client: Client) -> None:
    state = await run_scenario(
        client,
        {
            "name": "fallback-model",
            "task": "Spend carefully.",
            "planner": [
                {
                    "tool_calls": [{"name": "calculator", "input": {"expression": "1+1"}}],
                    "usage": {"input_tokens": 30_000, "output_tokens": 0},
                },  # $0.09 at sonnet prices
                {"tool_calls": [{"name": "calculator", "input": {"expression": "2+2"}}]},
                submit("4"),
            ],
            "limits": {"cost_ceiling_usd": 0.11},
        },
    )
    assert state.status == "completed", state.final_reason
    assert state.model == "claude-haiku-4-5"
    assert any("switched model claude-sonnet-4-6 -> claude-haiku-4-5" in w for w in state.warnings)
    assert "budget.fallback" in await budget_events(client, state.run_id)
