"""The escalation service reads only its own data (issue 37, item 4): what a queue item says about its run (its
tenant) is what the raise or the failure event carried, never the planner's record of the run (``lw_runs``) or its
conversation (``lw_history``), and its grant cannot read them. An item keeps no copy of the run's turns: the
readers (the console, ``loopwarden escalations show``) read them from the run's conversation when they show it."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from services.escalation import queue as Q
from services.planner import stalls
from services.planner.outbox import Outbox
from services.planner.outcomes import apply_outcome
from services.planner.state import RunState
from services.planner.turns import apply_model_response, resolve_config, start_run
from shared import subjects as S
from shared.messages import (
    DeadLetter,
    EscalationRaise,
    RunLimits,
    RunSubmit,
    ToolCall,
    ToolContract,
    ToolOutcome,
    ToolUseBlock,
    utcnow,
)
from shared.permissions import GRANTS, RETIRED_READS, grants, render, rights
from shared.providers.base import ModelResponse
from shared.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
ESCALATION = ROOT / "services" / "escalation"
# the planner's record of a run and its conversation, by every name code could reach them with
PLANNERS_DATA = {
    "KV_RUNS",
    "KV_HISTORY",
    S.KV_RUNS,
    S.KV_HISTORY,
    "RunSnapshot",
    "RunState",
    "RunRecord",
    "shared.history",
    "services.planner",
}
SEARCH = {"type": "object"}
TOOLS = {"search": ToolContract(name="search", description="s", inputSchema=SEARCH, outputSchema=SEARCH)}


def planners_data_named(tree: ast.Module) -> list[tuple[int, str]]:
    """Where a module names the planner's data: an attribute or name (``S.KV_RUNS``, ``RunSnapshot``), a string
    (``"lw_runs"``), an import (``from shared import history``, ``shared.history``)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in PLANNERS_DATA:
            found.append((node.lineno, node.attr))
        elif isinstance(node, ast.Name) and node.id in PLANNERS_DATA:
            found.append((node.lineno, node.id))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in PLANNERS_DATA:
            found.append((node.lineno, node.value))
        elif isinstance(node, ast.ImportFrom):
            names = [f"{node.module}.{a.name}" for a in node.names] + [str(node.module)]
            found += [(node.lineno, n) for n in names if n in PLANNERS_DATA or n.split(".")[-1] in PLANNERS_DATA]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name in PLANNERS_DATA]
    return found


# --- the service's code and its grant ------------------------------------------------------------------------


def test_no_module_of_the_escalation_service_names_the_planners_record_or_conversation() -> None:
    named = {
        str(path.relative_to(ROOT)): hits
        for path in sorted(ESCALATION.rglob("*.py"))
        if (hits := planners_data_named(ast.parse(path.read_text())))
    }
    assert not named, f"the escalation service reads what its raise carried, not the planner's data: {named}"


def test_the_check_finds_each_way_of_reading_the_planners_record() -> None:
    spelled = """
from shared import history
from shared.messages import RunSnapshot
snap = await bus.kv_get(S.KV_RUNS, run_id, RunSnapshot)
kv = await bus.kv("lw_history")
"""
    assert sorted({name for _, name in planners_data_named(ast.parse(spelled))}) == [
        "KV_RUNS",
        "RunSnapshot",
        "lw_history",
        "shared.history",
        "shared.messages.RunSnapshot",
    ]


def test_the_escalation_services_grant_reads_neither_the_runs_records_nor_their_conversations() -> None:
    grant = GRANTS["escalation"]
    assert S.KV_RUNS not in grant.kv_read and S.KV_HISTORY not in grant.kv_read
    assert S.KV_RUNS not in grant.kv_write and S.KV_HISTORY not in grant.kv_write
    publish, _ = rights("escalation", grants([])["escalation"])
    reaches = [p for p in publish if f"KV_{S.KV_RUNS}" in p or f"KV_{S.KV_HISTORY}" in p or S.KV_RUNS in p]
    assert reaches == [], reaches
    # besides the buckets it writes, it reads the registry of the tools' contracts (a provided result meets it)
    assert set(grant.kv_read) == {S.KV_CONTRACTS}


def escalation_user(conf: str) -> str:
    return conf.split('user: "escalation"', 1)[1].split("{ user:", 1)[0]


def test_an_auth_conf_written_while_upgrading_keeps_the_retired_reads_for_the_last_releases_replicas() -> None:
    # 0.31's escalation service still reads the run's record and conversation: while it runs beside 0.32's,
    # `config apply --upgrading` keeps those reads; written again without it, they are gone
    assert RETIRED_READS["escalation"] == (S.KV_RUNS, S.KV_HISTORY)
    assert all(r not in GRANTS[svc].kv_read for svc, reads in RETIRED_READS.items() for r in reads)
    upgrading = grants([], upgrading=True)["escalation"]
    assert set(upgrading.kv_read) == {S.KV_CONTRACTS, S.KV_RUNS, S.KV_HISTORY}
    during, after = escalation_user(render([], upgrading=True)), escalation_user(render([]))
    for bucket in (S.KV_RUNS, S.KV_HISTORY):
        assert f'"$JS.API.DIRECT.GET.KV_{bucket}.>"' in during and f"KV_{bucket}" not in after
    assert "WHILE UPGRADING" in render([], upgrading=True) and "WHILE UPGRADING" not in render([])
    assert {u: g for u, g in grants([], upgrading=True).items() if u != "escalation"} == {
        u: g for u, g in grants([]).items() if u != "escalation"
    }  # nobody else's rights change


# --- what an item says about its run is what the raiser carried ----------------------------------------------


def test_an_item_keeps_the_tenant_its_raise_carried_and_no_copy_of_the_runs_turns() -> None:
    raise_ = EscalationRaise(escalation_id="e1", run_id="r1", kind="schema_cap", reason="cap", tenant="acme")
    item = Q.raise_item(raise_, None)
    assert item.tenant == "acme"
    assert item.context == []  # a reader fills it from the run's conversation when it shows the item
    assert "context" not in EscalationRaise.model_fields  # a raiser has no way to hand the queue a copy


def test_an_item_filed_from_a_failure_event_says_the_tenant_its_call_carried() -> None:
    call = ToolCall(
        run_id="r1", iteration=1, call_id="c1", attempt_id="a1", tool="pay", requested_tool="pay", arguments={}
    )
    failure: dict[str, Any] = {"success": False, "failure_type": "fatal", "error": "the card was refused"}
    mine = ToolOutcome(**{**call.model_dump(), "tenant": "acme", **failure})
    assert Q.raise_item(Q.failure_raise(mine), None).tenant == "acme"
    older = ToolOutcome(**{**call.model_dump(), **failure})  # from an executor of the last release
    assert Q.raise_item(Q.failure_raise(older), None).tenant is None


def test_open_items_count_against_the_tenant_each_item_names_and_one_naming_none_against_the_default() -> None:
    def item(n: int, tenant: str | None, status: str = "open") -> Q.Escalation:
        raise_ = EscalationRaise(escalation_id=f"e{n}", run_id=f"r{n}", kind="fatal", reason="x", tenant=tenant)
        return Q.raise_item(raise_, None).model_copy(update={"status": status})

    items = [item(1, "acme"), item(2, "acme", "claimed"), item(3, None), item(4, "globex", "resolved")]
    assert Q.open_by_tenant(items) == {"acme": 2, S.DEFAULT_TENANT: 1}


# --- the planner puts it on what it publishes ----------------------------------------------------------------


def acme_run(**limits: Any) -> RunState:
    submit = RunSubmit(run_id="r1", task="Find it.", tenant="acme", limits=RunLimits(**limits))
    return start_run(submit, resolve_config(submit, Settings(), TOOLS), []).state


def published(out: Outbox, model: type[Any]) -> list[Any]:
    return [model.model_validate_json(i.payload) for i in out.items if i.model == model.__name__]


def test_the_planners_calls_and_raises_carry_the_runs_tenant() -> None:
    state = acme_run(max_schema_corrections=0)
    call_out = apply_model_response(
        state, ModelResponse(text="", tool_calls=[ToolUseBlock(id="c1", name="search", input={})], model="m"), TOOLS
    )
    [call] = published(call_out, ToolCall)
    assert call.tenant == "acme"
    failed = call.model_dump() | {"success": False, "failure_type": "input_invalid", "error": "q is required"}
    [raised] = published(apply_outcome(state, ToolOutcome(**failed)), EscalationRaise)
    assert raised.kind == "schema_cap" and raised.tenant == "acme"


def test_a_stalled_runs_raise_and_withdraw_carry_the_runs_tenant() -> None:
    state = acme_run()
    letter = DeadLetter(
        service="planner",
        subject=S.RUN_ADVANCE,
        reason="provider unavailable",
        body='{"run_id": "r1", "iteration": 1}',
        headers={"Lw-Run-Id": "r1"},
        requeue_to=S.requeue("planner"),
    )
    out = stalls.held_up_by(state, 7, letter, requeue_to=S.requeue("planner"), now=utcnow())
    assert out is not None
    [raised] = published(out, EscalationRaise)
    assert (raised.kind, raised.tenant) == ("stalled", "acme")
