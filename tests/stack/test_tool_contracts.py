"""Tool contracts end to end: input and output validation, self-correction within a cap, repairs,
normal-failure variants, MCP tools, registration refusals and contract metrics."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any

from loopwarden.client import Client, tool_metrics
from loopwarden.stack import LocalStack
from shared import subjects as S
from shared.messages import ToolContract
from tests.support.otlp_collector import OtlpCollector
from tests.support.paths import ROOT
from tests.support.runs import GOOD_SEARCH, escalations_of, run_scenario, submit, tool_results
from tests.support.timing import bound, polls


async def test_malformed_output_is_corrected_by_the_model_within_the_cap(client: Client) -> None:
    state = await run_scenario(
        client,
        {
            "name": "malformed-output-corrected",
            "task": "What does the corpus say about dedupe?",
            "planner": [
                {"tool_calls": [{"name": "search", "input": {"query": "dedupe"}}]},
                {
                    "text": "The result broke its contract; trying a more specific query.",
                    "tool_calls": [{"name": "search", "input": {"query": "jetstream message de-duplication"}}],
                },
                submit("JetStream drops a repeated Nats-Msg-Id inside the window."),
            ],
            "tools": {
                "search": [
                    {
                        "output": {
                            "status": "success",
                            "totalCount": 1,
                            "results": [{"title": "t", "snippet": "s"}],
                            "score": 0.7,
                        }
                    },
                    {"output": GOOD_SEARCH},
                ]
            },
        },
    )
    assert state.status == "completed", state.final_reason
    first, second = tool_results(state)[:2]
    assert first.is_error and not second.is_error
    assert "returned output that breaks its output contract" in first.content
    assert "$.results[0] is missing required field 'url'" in first.content
    assert "$ has unexpected field(s) 'score'" in first.content
    assert "Schema:" in first.content and '"format":"uri"' in first.content  # the schema is fed back
    assert state.corrections["search"] == {"failures": 1, "recovered": 1, "escalated": 0}
    m = tool_metrics(await client.events(state.run_id))["search"]
    assert m["validation_pass_rate"] == 0.5 and m["correction_success_rate"] == 1.0
    assert m["attempts"] == 2  # each output came from one attempt (neither has an event of its own)


async def test_bad_arguments_are_never_executed_and_the_model_corrects_them(client: Client) -> None:
    state = await run_scenario(
        client,
        {
            "name": "bad-arguments-corrected",
            "task": "Convert 100 USD to EUR.",
            "planner": [
                {
                    "tool_calls": [
                        {
                            "name": "exchange_rate",
                            "id": "toolu_bad",
                            "input": {"base": "USD", "quote": "euro", "amount": 100},
                        }
                    ]
                },
                {
                    "tool_calls": [
                        {"name": "exchange_rate", "id": "toolu_good", "input": {"base": "usd", "quote": "eur"}}
                    ]
                },
                submit("100 USD is about 92.59 EUR."),
            ],
        },
    )
    assert state.status == "completed", state.final_reason
    bad = tool_results(state)[0]
    assert bad.is_error and "was not executed" in bad.content
    assert "$.base must be one of usd, eur, krw, jpy, gbp; got 'USD'" in bad.content
    assert "$.quote must be one of usd, eur, krw, jpy, gbp; got 'euro'" in bad.content
    assert "unexpected field(s) 'amount'" in bad.content
    events = await client.events(state.run_id)
    ran = [e.payload["call_id"] for e in events if e.kind.startswith(("tool.attempt.", "tool.succeeded."))]
    assert "toolu_bad" not in ran and "toolu_good" in ran  # the bad call never ran
    failure = next(e for e in events if e.kind == "failure.input_invalid.exchange_rate")
    assert [err["path"] for err in failure.payload["errors"]] == ["$", "$.base", "$.quote"]


async def test_a_correction_that_never_succeeds_escalates_after_the_cap(client: Client) -> None:
    bad = {"name": "calculator", "input": {"expr": "1+1"}}
    state = await run_scenario(
        client,
        {
            "name": "never-corrected",
            "task": "Add one and one.",
            "planner": [{"tool_calls": [bad]}, {"tool_calls": [bad]}, {"tool_calls": [{**bad, "id": "toolu_third"}]}],
            "limits": {"max_schema_corrections": 2},
        },
        until=("awaiting_human",),
    )
    assert state.awaiting is not None and state.awaiting.kind == "schema_cap"
    assert state.model_calls == 3  # the model got two corrections; the third failure went to a human
    assert [r.is_error for r in tool_results(state)] == [True, True]
    items = await escalations_of(client, state.run_id)
    assert [(e.kind, e.tool) for e in items] == [("schema_cap", "calculator")]
    assert "failed its contract 3 times in a row (cap 2)" in items[0].reason
    assert (await client.resolve(state.awaiting.escalation_id, "oncall", "abort", "broken prompt")).ok
    done = await client.wait(state.run_id, timeout=bound(60))
    assert done.status == "stopped" and "aborted by oncall" in (done.final_reason or "")


async def test_a_not_found_variant_passes_validation(client: Client) -> None:
    state = await run_scenario(
        client,
        {
            "name": "not-found-is-normal",
            "task": "Find the corpus page about kubernetes operators.",
            "planner": [
                {"tool_calls": [{"name": "search", "input": {"query": "kubernetes operators helm"}}]},
                submit("The corpus has nothing about Kubernetes operators."),
            ],
        },
    )
    assert state.status == "completed"
    result = tool_results(state)[0]
    assert not result.is_error and json.loads(result.content)["status"] == "not_found"
    assert state.corrections.get("search", {}).get("failures", 0) == 0


async def test_mcp_tools_pass_the_same_checks(client: Client) -> None:
    contracts = {c.name for c in await contracts_in_kv(client)}
    assert {"lookup_order", "inventory_report", "cancel_order"} <= contracts
    assert "export_orders" not in contracts  # its schema mixes dialects: refused at registration
    state = await run_scenario(
        client,
        {
            "name": "mcp",
            "task": "Is order 1001 shipped, does 999 exist, and how many A-1 are in stock?",
            "planner": [
                {
                    "tool_calls": [
                        {"name": "lookup_order", "input": {"order_id": 1001}},
                        {"name": "lookup_order", "input": {"order_id": 999}},
                        {"name": "inventory_report", "input": {"sku": "BROKEN"}},
                    ]
                },
                {"tool_calls": [{"name": "inventory_report", "input": {"sku": "A-1"}}]},
                {"tool_calls": [{"name": "export_orders", "input": {}}]},
                submit("1001 shipped; 999 does not exist; 12 units of A-1."),
            ],
        },
    )
    assert state.status == "completed", state.final_reason
    found, missing, broken, repaired, export = tool_results(state)
    assert json.loads(found.content) == {"order_id": 1001, "status": "shipped", "total_cents": 4200}
    assert json.loads(missing.content)["status"] == "not_found" and not missing.is_error
    assert broken.is_error and "the output is not valid JSON" in broken.content  # text that does not parse
    assert json.loads(repaired.content) == {"sku": "A-1", "count": 12}  # "12" repaired by the registered rule
    assert export.is_error and "There is no tool named 'export_orders'" in export.content
    m = tool_metrics(await client.events(state.run_id))["inventory_report"]
    assert m["parse_success_rate"] == 0.5 and m["repair_rate"] == 0.5 and m["correction_success_rate"] == 1.0


async def test_an_mcp_error_result_goes_back_to_the_model(client: Client) -> None:
    state = await run_scenario(
        client,
        {
            "name": "mcp-error",
            "task": "Cancel order 1001.",
            "planner": [
                {"tool_calls": [{"name": "cancel_order", "id": "toolu_cancel", "input": {"order_id": 1001}}]},
                submit("Order 1001 already shipped, so it cannot be cancelled."),
            ],
        },
    )
    assert state.status == "completed", state.final_reason  # an isError result is the model's to read (issue 14)
    result = tool_results(state)[0]
    assert result.is_error and "'cancel_order' reported an error: order already shipped" in result.content


async def test_the_post_call_hook_runs_before_output_validation(client: Client) -> None:
    state = await run_scenario(
        client,
        {
            "name": "post-hook",
            "task": "EUR to USD?",
            "planner": [
                {"tool_calls": [{"name": "exchange_rate", "input": {"base": "eur", "quote": "usd"}}]},
                submit("1 EUR = 1.08 USD"),
            ],
            "tools": {
                "exchange_rate": [
                    {"output": {"base": "eur", "quote": "usd", "rate": "1.0812345678", "as_of": "2026-11-30T00:00:00Z"}}
                ]
            },
        },
    )
    result = tool_results(state)[0]
    assert not result.is_error and json.loads(result.content)["rate"] == 1.081235  # normalized, then validated


async def test_contract_metrics_are_exported_as_opentelemetry_metrics(client: Client, otlp: OtlpCollector) -> None:
    await test_malformed_output_is_corrected_by_the_model_within_the_cap(client)
    for _ in range(polls(80)):  # metrics export every 5 s
        outputs = otlp.metrics.get(("loopwarden-validator", "loopwarden.tool.outputs"), [])
        corrections = otlp.metrics.get(("loopwarden-planner", "loopwarden.tool.corrections"), [])
        recovered = any(p.get("outcome") == "recovered" and p.get("tool") == "search" for p in corrections)
        if {"valid", "invalid"} <= {p.get("result") for p in outputs if p.get("tool") == "search"} and recovered:
            break  # what is asserted below has been exported (not merely some correction, e.g. an escalation)
        await asyncio.sleep(0.25)
    assert {"valid", "invalid"} <= {p.get("result") for p in outputs if p.get("tool") == "search"}
    assert any(p.get("outcome") == "recovered" and p.get("tool") == "search" for p in corrections)


async def contracts_in_kv(client: Client) -> list[ToolContract]:
    out = []
    for key in await client.bus.keys(S.KV_CONTRACTS):
        contract, _ = await client.bus.kv_get(S.KV_CONTRACTS, key, ToolContract)
        if contract:
            out.append(contract)
    return out


def test_a_mixed_dialect_contract_file_is_refused_but_the_rest_load(stack: LocalStack, tmp_path: Any) -> None:
    contract = json.loads((ROOT / "schemas" / "tools" / "search.json").read_text())
    contract["name"] = "search_v2"
    contract["inputSchema"]["$defs"] = {"q": {"type": "string"}}
    contract["inputSchema"]["definitions"] = {"r": {"type": "string"}}  # both containers: mixed dialects
    (tmp_path / "search_v2.json").write_text(json.dumps(contract))
    ok = json.loads((ROOT / "schemas" / "tools" / "submit_result.json").read_text())
    ok["name"] = "submit_v2"
    (tmp_path / "submit_v2.json").write_text(json.dumps(ok))
    env = {**os.environ, "LW_TOOL_CONTRACT_DIR": str(tmp_path), "LW_NATS_URL": stack.nats_url or ""}
    proc = subprocess.run(
        [sys.executable, "-m", "loopwarden.cli", "lint"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=bound(60),
    )
    assert proc.returncode == 1  # something was refused
    assert (
        "REFUSED search_v2: tool 'search_v2' inputSchema: 'definitions' beside '$defs' mixes dialects "
        "(schema dialect is 2020-12); keep '$defs'" in proc.stdout
    )
    assert "(keyword 'definitions' at #/definitions)" in proc.stdout
    assert "REFUSED submit_v2" not in proc.stdout  # the valid contract beside it still registers
    assert "9 tool(s) registered, 1 refused" in proc.stdout


async def test_an_executor_logs_the_refusal_and_hosts_the_rest(
    stack: LocalStack, client: Client, tmp_path: Any
) -> None:
    bad = {
        "name": "bad_tool",
        "description": "a tool whose schema mixes dialects",
        "entrypoint": "services.executor.tools.demo:submit_result",
        "outputSchema": {"type": "object"},
        "inputSchema": {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "properties": {"a": {"type": "object", "unevaluatedProperties": False}},
        },
    }
    (tmp_path / "bad_tool.json").write_text(json.dumps(bad))
    proc = stack.start_service(
        "executor",
        label="executor-extra",
        extra_env={"LW_TOOL_CONTRACT_DIR": str(tmp_path), "LW_EXECUTOR_TOOLS": "bad_tool"},
    )
    try:
        stack.wait_ready([proc])
        log = proc.log.read_text()
        assert "refused tool registration: tool 'bad_tool' inputSchema" in log
        assert "(keyword 'unevaluatedProperties' at #/properties/a/unevaluatedProperties)" in log
        assert "bad_tool" not in {c.name for c in await contracts_in_kv(client)}
    finally:
        proc.popen.terminate()
        proc.popen.wait(bound(15))
