"""An operator can finish every escalating scenario we ship, with every action that applies, and the
queue shows what is worth acting on. Runs on the session stack (real nats-server, every service)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from typing import Any

import pytest
import yaml

from loopwarden.client import Client
from loopwarden.stack import LocalStack
from shared import subjects as S
from shared.messages import Escalation, EscalationClaim, EscalationReply, escalation_id_for_call
from shared.scenario import parse_scenario
from tests.support.paths import ROOT
from tests.support.runs import escalations_of
from tests.support.timing import bound

SCENARIOS = {p.stem: yaml.safe_load(p.read_text()) for p in sorted((ROOT / "scenarios").glob("*.yaml"))}
ESCALATING = [name for name, s in SCENARIOS.items() if (s.get("expect") or {}).get("status") == "awaiting_human"]
# what an operator types for provide_result, per tool (it must meet the tool's output contract)
RESULTS = {"calculator": {"status": "ok", "expression": "1+1", "result": 2}}
ACTIONS = {
    "correction-escalates": ["provide_result", "retry", "resume", "final_answer", "abort"],
    "judge-unparseable": ["approve", "accept", "reject", "final_answer", "abort"],
    # no provide_result: a tool no replica hosts has no output contract to check a result against
    "missing-tool-escalates": ["retry", "resume", "final_answer", "abort"],
}


async def raised(client: Client, name: str) -> tuple[str, Escalation]:
    run_id = await client.submit_scenario(parse_scenario(SCENARIOS[name]))
    state = await client.wait(run_id, timeout=bound(30), until=("awaiting_human",))
    assert state.awaiting is not None
    items = await escalations_of(client, run_id)
    assert len(items) == 1, items
    return run_id, items[0]


def test_every_escalating_scenario_is_covered() -> None:
    assert set(ESCALATING) == set(ACTIONS)


@pytest.mark.parametrize(
    ("scenario", "action"), [(name, action) for name, actions in ACTIONS.items() for action in actions]
)
async def test_an_operator_finishes_a_shipped_scenario_with_each_action(
    client: Client, scenario: str, action: str
) -> None:
    run_id, item = await raised(client, scenario)
    assert action in item.allowed_actions
    assert (await client.claim(item.escalation_id, "oncall")).ok
    result: Any = None
    note = "looked at it"
    if action == "provide_result":
        result = RESULTS[str(item.tool)]
    if action == "final_answer":
        result = "Two, written by a person."
    if action == "retry":
        note = "use the field 'expression', not 'expr'"
    reply = await client.resolve(item.escalation_id, "oncall", action, note, result)  # type: ignore[arg-type]
    assert reply.ok, reply.error
    assert reply.escalations[0].resolution is not None
    assert reply.escalations[0].resolution.resolved_by == "oncall"
    state = await client.wait(run_id, timeout=bound(30))
    if action == "abort":
        assert state.status == "stopped" and "aborted by oncall" in (state.final_reason or "")
        return
    assert state.status == "completed", state.final_reason
    if action == "final_answer":
        assert state.final_output == "Two, written by a person."
        assert "final answer provided by oncall" in (state.final_reason or "")
    elif scenario == "correction-escalates":
        assert state.final_output == "1 + 1 = 2"
    if action == "retry":
        texts = [b.content for m in state.messages for b in m.content if b.type == "tool_result"]
        assert any("A human asks you to try again: use the field 'expression'" in t for t in texts)
    if action == "reject":
        assert state.retry_count == 1 and state.passed is True and "duplicate window" in (state.final_output or "")


async def test_an_item_carries_what_a_person_needs_to_act(client: Client) -> None:
    _, item = await raised(client, "correction-escalates")
    assert (item.kind, item.tool) == ("schema_cap", "calculator")
    assert "failed its contract 3 times" in item.reason
    assert item.details["arguments"] == {"expr": "1+1"} and item.details["failure_type"] == "input_invalid"
    assert "expression" in str(item.details["error"])  # the model-readable error names the missing field
    assert item.allowed_actions == ["provide_result", "retry", "resume", "final_answer", "abort"]
    assert item.sla_deadline is not None and item.sla_action == "abort"
    assert item.context == []  # the queue keeps no copy of the run's turns ...
    shown = await client.show(item.escalation_id)  # ... its reader reads them from the run's conversation
    assert shown.ok and shown.escalations[0].escalation_id == item.escalation_id
    turns = shown.escalations[0].context
    assert turns and turns[0].role == "user" and "Add one and one" in turns[0].text()
    assert turns == (await client.state(item.run_id, history=True)).messages[-6:]  # type: ignore[union-attr]


async def test_a_hand_made_result_must_meet_the_tools_output_contract(client: Client) -> None:
    run_id, item = await raised(client, "correction-escalates")
    bad = await client.resolve(item.escalation_id, "oncall", "provide_result", result={"status": "ok", "result": "2"})
    assert not bad.ok and "breaks the output contract of 'calculator'" in (bad.error or ""), bad.error
    assert (await client.state(run_id)).status == "awaiting_human"  # type: ignore[union-attr]
    good = await client.resolve(item.escalation_id, "oncall", "provide_result", result=RESULTS["calculator"])
    assert good.ok, good.error
    assert (await client.wait(run_id, timeout=bound(60))).status == "completed"


async def test_list_filters_by_state_kind_tool_run_and_age(client: Client) -> None:
    run_a, a = await raised(client, "correction-escalates")
    run_b, b = await raised(client, "judge-unparseable")

    async def ids(**query: Any) -> set[str]:
        reply = await client.escalations(**query)
        assert reply.ok, reply.error
        return {e.escalation_id for e in reply.escalations} & {a.escalation_id, b.escalation_id}

    assert await ids() == {a.escalation_id, b.escalation_id}
    assert await ids(kind="not_judged") == {b.escalation_id}
    assert await ids(tool="calculator") == {a.escalation_id}
    assert await ids(run_id=run_a) == {a.escalation_id}
    assert await ids(newer_than_s=600) == {a.escalation_id, b.escalation_id}
    assert await ids(older_than_s=600) == set()
    assert (await client.claim(a.escalation_id, "oncall")).ok
    assert await ids(status="claimed") == {a.escalation_id}
    assert await ids(status="open") == {b.escalation_id}
    for item in (a, b):
        assert (await client.resolve(item.escalation_id, "oncall", "abort")).ok
    assert await ids(status="resolved") == {a.escalation_id, b.escalation_id}
    for run in (run_a, run_b):
        await client.wait(run, timeout=bound(60))


async def test_one_malformed_record_never_hides_the_others(client: Client) -> None:
    run_id, item = await raised(client, "judge-unparseable")
    kv = await client.bus.kv(S.KV_ESCALATIONS)
    broken = f"esc-broken-{uuid.uuid4().hex[:8]}"
    await kv.put(broken, b'{"escalation_id": "half a record", "kind": 42')
    try:
        reply = EscalationReply(ok=False)
        for _ in range(int(bound(100))):  # the service's watcher sees the write a moment later
            reply = await client.escalations("all")
            if broken in reply.unreadable:
                break
            await asyncio.sleep(0.05)
        assert reply.ok and broken in reply.unreadable
        assert item.escalation_id in {e.escalation_id for e in reply.escalations}
        shown = await client.show(broken)
        assert not shown.ok and "does not parse" in (shown.error or "")
    finally:
        await kv.delete(broken)
    assert (await client.resolve(item.escalation_id, "oncall", "abort")).ok
    await client.wait(run_id, timeout=bound(60))


async def test_claims_renewals_and_resolutions_are_events_with_the_verified_operator(client: Client) -> None:
    run_id, item = await raised(client, "judge-unparseable")
    assert (await client.claim(item.escalation_id, "oncall")).ok
    renewed = await client.renew(item.escalation_id, "oncall")
    assert renewed.ok and renewed.escalations[0].lease_expires_at is not None
    refused = await client.renew(item.escalation_id, "intern")
    assert not refused.ok and "not claimed by intern" in (refused.error or "")
    assert (await client.resolve(item.escalation_id, "oncall", "approve", "reads well")).ok
    await client.wait(run_id, timeout=bound(60))
    events = await client.events(run_id, subjects=f"{S.ESCALATION_EVENT_PREFIX}.>", timeout=bound(0.5))
    kinds = [e.kind for e in events]
    assert kinds[:1] == ["escalation.raised"] and "escalation.resolved" in kinds
    claimed = next(e.payload for e in events if e.kind == "escalation.claimed")
    assert claimed["operator"] == "oncall" and claimed.get("via") is None and claimed["lease_expires_at"]
    assert next(e.payload for e in events if e.kind == "escalation.renewed")["operator"] == "oncall"
    resolution = next(e.payload for e in events if e.kind == "escalation.resolved")
    assert resolution["resolved_by"] == "oncall" and resolution["action"] == "approve"


async def test_a_request_on_a_subject_without_an_operator_is_refused_and_recorded(client: Client) -> None:
    run_id, item = await raised(client, "judge-unparseable")
    # the pre-identity subject, with a name in the payload: not an identity
    reply = await client.bus.request(
        S.ESCALATION_CLAIM, EscalationClaim(escalation_id=item.escalation_id, who="finance"), EscalationReply
    )
    assert not reply.ok and "refused: no verified identity" in (reply.error or "")
    shown = (await client.show(item.escalation_id)).escalations[0]
    assert shown.status == "open" and shown.trail[-1].kind == "refused"
    refusals = await client.events(run_id, subjects=S.ESCALATION_REFUSED, timeout=bound(0.5))
    assert [e.payload["action"] for e in refusals] == ["claim"]
    assert (await client.resolve(item.escalation_id, "oncall", "abort")).ok
    await client.wait(run_id, timeout=bound(60))


async def cli(stack_url: str, *args: str) -> tuple[int, str, str]:
    env = {**os.environ, "LW_NATS_URL": stack_url, "LW_LOG_LEVEL": "WARNING"}
    env.pop("LW_NATS_USER", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "loopwarden.cli", "escalations", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()


async def test_the_cli_lists_shows_claims_renews_and_resolves(client: Client, stack: LocalStack) -> None:
    run_id, item = await raised(client, "correction-escalates")
    url = str(stack.nats_url)
    code, out, _ = await cli(url, "list", "--kind", "schema_cap", "--tool", "calculator", "--run", run_id)
    assert code == 0 and item.escalation_id in out and "schema_cap" in out
    code, out, _ = await cli(url, "list", "--run", run_id, "--older-than", "3600")
    assert code == 0 and item.escalation_id not in out
    code, out, _ = await cli(url, "show", item.escalation_id)  # the console's text view
    assert code == 0 and item.escalation_id in out and "final_answer" in out and "1+1" in out, out
    code, out, _ = await cli(url, "show", item.escalation_id, "--json")
    shown = json.loads(out)
    assert code == 0 and shown["details"]["arguments"] == {"expr": "1+1"} and "final_answer" in shown["allowed_actions"]
    code, out, _ = await cli(url, "claim", item.escalation_id, "--as", "oncall")
    assert code == 0 and "claimed by oncall" in out and "lease until" in out
    code, out, err = await cli(url, "renew", item.escalation_id, "--as", "intern")
    assert code == 1 and "not claimed by intern" in err
    code, out, _ = await cli(url, "renew", item.escalation_id, "--as", "oncall")
    assert code == 0
    code, out, err = await cli(
        url, "resolve", item.escalation_id, "--as", "oncall", "--action", "final_answer", "--answer", "Two."
    )
    assert code == 0, err
    state = await client.wait(run_id, timeout=bound(60))
    assert state.status == "completed" and state.final_output == "Two."


FATAL = {
    "name": "fatal-shown",
    "task": "Read the orders of cus_ada1.",
    "planner": [
        {"text": "Looking at the orders table first.", "tool_calls": [
            {"name": "sql_query", "id": "toolu_orders", "input": {"query": "select * from orders"}}
        ]}
    ],
    "tools": {"sql_query": [{"fail": "fatal", "error": "permission denied for table orders"}]},
}  # fmt: skip


async def test_an_item_filed_from_a_failure_event_shows_the_runs_last_turns(client: Client, stack: LocalStack) -> None:
    """A ``fatal`` item is filed by the escalation service from the failure event (no raise from the planner):
    it keeps the tenant the call carried and no turns; the CLI and ``Client.show`` read the run's last turns
    from its conversation when they show it, as for every other kind of item."""
    run_id = await client.submit_scenario(parse_scenario(FATAL))
    state = await client.wait(run_id, timeout=bound(60), until=("awaiting_human",))
    esc_id = escalation_id_for_call(run_id, 1, "toolu_orders")
    [listed] = await escalations_of(client, run_id)
    assert (listed.escalation_id, listed.kind, listed.tool) == (esc_id, "fatal", "sql_query")
    raised = await client.events(subjects=S.ESCALATION_RAISE)  # filed from its subscription, not a raise
    assert not [e for e in raised if e.payload.get("escalation_id") == esc_id]
    stored, _ = await client.bus.kv_get(S.KV_ESCALATIONS, esc_id, Escalation)
    assert stored is not None and stored.context == []  # no copy of the turns is stored ...
    assert state.tenant and stored.tenant == state.tenant  # ... the call carried its run's tenant
    whole = (await client.state(run_id, history=True)).messages  # type: ignore[union-attr]
    shown = (await client.show(esc_id)).escalations[0]  # ... its reader reads them from the run's conversation
    assert shown.context == whole[-6:] and "Read the orders of cus_ada1." in shown.context[0].text()
    assert (await client.show(esc_id, turns=1)).escalations[0].context == whole[-1:]
    assert (await client.show(esc_id, turns=0)).escalations[0].context == []

    url = str(stack.nats_url)
    code, out, err = await cli(url, "show", esc_id)  # the console's text view
    assert code == 0, err
    turns = out.split("── Last turns ──", 1)[1].split("──", 1)[0]
    assert "user: Read the orders of cus_ada1." in turns, out
    assert "assistant: Looking at the orders table first." in turns and "assistant: → sql_query" in turns, out
    code, out, err = await cli(url, "show", esc_id, "--json")
    assert code == 0, err
    assert "Read the orders of cus_ada1." in json.dumps(json.loads(out)["context"][0])
    assert (await client.resolve(esc_id, "oncall", "abort", "no access")).ok
    assert (await client.wait(run_id, timeout=bound(60))).status == "stopped"
