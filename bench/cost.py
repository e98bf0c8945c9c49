"""Cost as the bill says it (issue 11): what a long run sends and pays, and what a budget check costs.

* An 80-step scripted run whose tool returns ~2k tokens each step, through the real stack, twice:
  with the governor's budgets (compaction, keep the last turns verbatim) and keeping the whole
  history (a context budget nothing reaches). Total input tokens, compared (target <= 35 %).
* The same (budgeted) run's cost with prompt caching (cache reads at 0.1x, writes at 1.25x, as
  billed) against the same tokens billed uncached.
* A budget check (the planner's counting + the governor's decision) at step 10 against step 80,
  on the real history of that run: flat within 20 % (the history is counted once per message).
* Progressive disclosure: tokens of the tools section for a 30-tool catalogue, full vs one line
  per tool.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loopwarden.client import Client
from loopwarden.stack import LocalStack
from services.governor.budget import BudgetLedger, evaluate
from services.planner import context as C
from services.planner.state import RunState
from shared import subjects as S
from shared import tokens
from shared.messages import ChatMessage, RunLimits, ToolContract
from shared.pricing import cost_usd
from shared.scenario import parse_scenario
from shared.settings import Settings

SNIPPET = "lorem ipsum dolor sit amet, consectetur adipiscing elit " * 220  # ~2k tokens


def scenario(steps: int) -> dict[str, Any]:
    turns: list[dict[str, Any]] = [
        {
            "text": f"Step {i}: looking up part {i}.",
            "tool_calls": [{"name": "search", "input": {"query": f"part {i} of the survey"}}],
        }
        for i in range(steps)
    ]
    turns.append({"tool_calls": [{"name": "submit_result", "input": {"answer": "survey done"}}]})
    big = {
        "status": "success",
        "totalCount": 1,
        "results": [{"title": "survey", "url": "https://example.org/survey", "snippet": SNIPPET}],
    }
    return {
        "name": f"cost-bench-{steps}",
        "task": "Survey every part and submit when done.",
        "planner": turns,
        "tools": {"search": [{"output": big, "times": "always"}]},
    }


def limits(steps: int, whole_history: bool) -> RunLimits:
    return RunLimits(
        max_iterations=steps + 2,
        cost_ceiling_usd=500.0,
        run_token_budget=50_000_000,
        context_budget_tokens=5_000_000 if whole_history else None,
    )


async def _run(client: Client, steps: int, whole_history: bool) -> RunState:
    run_id = await client.submit_scenario(parse_scenario(scenario(steps)), limits=limits(steps, whole_history))
    snapshot = await client.wait(run_id, timeout=60 + steps * 4, history=True)
    assert snapshot.status == "completed", snapshot.final_reason
    # the planner's own record (configuration, iteration) with the whole conversation from lw_history
    state, _ = await client.bus.kv_get(S.KV_RUNS, run_id, RunState)
    assert state is not None, run_id
    state.messages = list(snapshot.messages)
    return state


def budget_check_at(
    state: RunState, step: int, contracts: dict[str, ToolContract]
) -> tuple[Callable[[], None], Callable[[], None]]:
    """(warm, check) for one budget check at ``step``: ``warm`` is the previous turn's check (the
    planner's tally is warm) and the arrival of the step's assistant turn and tool results, ``check``
    counts and decides."""
    head = state.messages[: 1 + 2 * (step - 1)]
    new = state.messages[1 + 2 * (step - 1) : 1 + 2 * step]
    probe = state.model_copy(update={"messages": list(head)})
    req = C.model_request(probe, contracts, probe.model, 2048)

    def warm() -> None:
        probe.messages = list(head)
        C.budget_request(probe, req)
        probe.messages = [*head, *new]

    def check() -> None:
        evaluate(
            C.budget_request(probe, req),
            BudgetLedger(run_id=probe.run_id),
            warn_at=0.7,
            compact_at=0.8,
            fallback_model="claude-haiku-4-5",
            exhausted_policy="fallback_model",
        )

    return warm, check


def check_times(
    state: RunState, steps: list[int], contracts: dict[str, ToolContract], reps: int, stat: Any = statistics.median
) -> list[float]:
    """Seconds of one budget check at each of ``steps`` (``stat`` of ``reps``, the median by default), the
    steps' checks taken in turn, so a machine whose speed drifts during the measurement moves them alike."""
    checks = [budget_check_at(state, step, contracts) for step in steps]
    times: list[list[float]] = [[] for _ in steps]
    for _ in range(reps):
        for (warm, check), out in zip(checks, times, strict=True):
            warm()
            t0 = time.perf_counter()
            check()
            out.append(time.perf_counter() - t0)
    return [float(stat(t)) for t in times]


def recount_time(state: RunState, step: int, reps: int, stat: Any = statistics.median) -> float:
    """The same check the old way: every message of the history counted again (from per-block caches)."""
    messages: list[ChatMessage] = state.messages[: 1 + 2 * step]
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        sum(tokens.count_message(m) for m in messages)
        times.append(time.perf_counter() - t0)
    return float(stat(times))


def catalogue(n: int, base: dict[str, ToolContract]) -> dict[str, ToolContract]:
    """``n`` tools: the registered ones, and more shaped like them (a realistic schema each)."""
    out = dict(base)
    i = 0
    while len(out) < n:
        i += 1
        out[f"lookup_{i:02d}"] = ToolContract(
            name=f"lookup_{i:02d}",
            description=f"Look up records of kind {i} by id or name. Returns the matching records with their "
            "fields, or status not_found. Use the filters to narrow large result sets.",
            inputSchema={
                "type": "object",
                "properties": {
                    "id": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{4}$", "description": "record id"},
                    "name": {"type": "string", "minLength": 2, "maxLength": 80, "description": "record name"},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 50, "description": "max records"},
                    "filters": {
                        "type": "object",
                        "properties": {
                            "status": {"enum": ["active", "archived", "pending"]},
                            "since": {"type": "string", "format": "date"},
                        },
                        "additionalProperties": False,
                    },
                },
                "additionalProperties": False,
            },
            outputSchema={"type": "object"},
        )
    return out


def disclosure(state: RunState, contracts: dict[str, ToolContract]) -> dict[str, float]:
    tools30 = catalogue(30, contracts)
    probe = state.model_copy(
        update={"tool_history": [], "config": state.config.model_copy(update={"allowed_tools": None})}
    )
    note = tokens.count(C.PROGRESSIVE_NOTE)  # the system prompt's line about it counts with the tools
    full = C.tools_tokens(C.tool_specs(probe, tools30))
    one_line = C.tools_tokens(C.tool_specs(probe, tools30, progressive_above=20)) + note
    probe.tool_history = [("search", ""), ("calculator", ""), ("exchange_rate", "")]
    three = C.tools_tokens(C.tool_specs(probe, tools30, progressive_above=20)) + note
    return {"tools": len(tools30), "full": full, "progressive": one_line, "progressive_3_used": three}


def run(steps: int = 80, reps: int = 300) -> dict[str, Any]:
    stack = LocalStack(
        state_dir=Path(tempfile.mkdtemp(prefix="lw-bench-cost-")),
        services=("planner", "executor", "validator", "judge", "governor", "escalation"),
    )
    stack.start()
    try:

        async def main() -> dict[str, Any]:
            async with Client(Settings(nats_url=stack.nats_url)) as client:
                budgeted = await _run(client, steps, whole_history=False)
                whole = await _run(client, steps, whole_history=True)
                contracts: dict[str, ToolContract] = {}
                for key in await client.bus.keys(S.KV_CONTRACTS):
                    contract, _ = await client.bus.kv_get(S.KV_CONTRACTS, key, ToolContract)
                    if contract is not None:
                        contracts[contract.name] = contract
            return {"budgeted": budgeted, "whole": whole, "contracts": contracts}

        got = asyncio.run(main())
    finally:
        stack.stop()
    budgeted: RunState = got["budgeted"]
    whole: RunState = got["whole"]
    u = budgeted.usage
    early, late = max(2, steps // 8), steps
    checks = check_times(whole, [early, late], got["contracts"], reps)
    return {
        "steps": steps,
        "budgeted_input": u.input_tokens,
        "whole_input": whole.usage.input_tokens,
        "compactions": budgeted.compactions,
        "cost_cached": u.cost_usd,
        "cost_uncached": cost_usd(budgeted.model, u.input_tokens, u.output_tokens),
        "cache_read": u.cache_read_input_tokens,
        "cache_write": u.cache_creation_input_tokens,
        "whole_cost_cached": whole.usage.cost_usd,
        "whole_cost_uncached": cost_usd(whole.model, whole.usage.input_tokens, whole.usage.output_tokens),
        "early": early,
        "late": late,
        **dict(zip(("check_early_s", "check_late_s"), checks, strict=True)),
        "recount_early_s": recount_time(whole, early, reps),
        "recount_late_s": recount_time(whole, late, reps),
        "disclosure": disclosure(whole, got["contracts"]),
    }


def report(r: dict[str, Any]) -> list[str]:
    share = r["budgeted_input"] / r["whole_input"]
    saving = 1 - r["cost_cached"] / r["cost_uncached"]
    flat = r["check_late_s"] / r["check_early_s"]
    d = r["disclosure"]
    return [
        f"cost: {r['steps']}-step scripted run, ~2k-token tool output per step (same scenario, real stack):",
        f"  input tokens, budgeted ({r['compactions']} compactions)  {r['budgeted_input']:>10,}   "
        f"{share:6.1%} of keeping the whole history   (target <= 35%)",
        f"  input tokens, whole history            {r['whole_input']:>10,}   100.0%",
        f"  cost with prompt caching   ${r['cost_cached']:8.4f}   (read {r['cache_read']:,} / written "
        f"{r['cache_write']:,} tokens)",
        f"  cost without caching       ${r['cost_uncached']:8.4f}   caching saves {saving:.1%} of the same run",
        f"  (whole history: ${r['whole_cost_cached']:.4f} cached vs ${r['whole_cost_uncached']:.4f} uncached)",
        f"  budget check at step {r['early']:>2}   {r['check_early_s'] * 1e6:8.1f} us",
        f"  budget check at step {r['late']:>2}   {r['check_late_s'] * 1e6:8.1f} us   {flat:5.2f}x   (target <= 1.20x)",
        f"  (recounting the whole history instead: {r['recount_early_s'] * 1e6:.1f} us -> "
        f"{r['recount_late_s'] * 1e6:.1f} us, {r['recount_late_s'] / r['recount_early_s']:.2f}x)",
        f"  tools section, {d['tools']} tools: full {d['full']:,} tokens, one line per tool {d['progressive']:,} "
        f"({d['progressive'] / d['full']:.1%}); with 3 tools used {d['progressive_3_used']:,} "
        f"({d['progressive_3_used'] / d['full']:.1%})",
    ]
