"""A client bound to a tenant reads that tenant's runs only (issue 23, item 7).

A private nats-server runs the generated deploy/nats/auth.conf with every service as its own user. The
default tenant's ``client`` (a single-tenant deployment's) reads every run directly; ``client_acme`` has no
read right on the runs' buckets, their event stream, the live events or the human queue, and reads its own
runs through the planner (``lw.v1.rpc.runs.<verb>.acme``), which answers for acme's runs only and answers any
other run exactly as a missing one. Each attack is made as ``client_acme`` and judged by what it got back.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import uuid
from collections.abc import Callable
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NatsClient

from loopwarden.client import Client
from services.planner.reads import fit, merge_pages, readable, tenant_of
from shared import subjects as S
from shared.bus import Stored
from shared.canonical import digest_of
from shared.messages import RunRead, RunSubmit
from shared.payloads import ref_for
from shared.scenario import parse_scenario
from shared.settings import Settings
from tests.support import locked as L
from tests.support.stacks import TEST_ENV
from tests.support.timing import BoundExpired, bound, eventually

# acme's day must outlast a 300 KB answer (the test default is $0.05 for every tenant but the default one)
# and a run's limits a long history (a few 80 KB turns, more than one answer of a 300 KB max_payload holds)
STACK_ENV = {
    **TEST_ENV,
    "LW_PLANNER_PROVIDER": "scripted",
    "LW_TENANT_CEILINGS": '{"default": 1000, "acme": 1000}',
    "LW_RUN_TOKEN_BUDGET": "5000000",
    "LW_CONTEXT_BUDGET_TOKENS": "1000000",
    "LW_COST_CEILING_USD": "100",
}
MAX_PAYLOAD = 300 * 1024  # the smallest that holds a claim-check chunk (256 KiB): pages come soon
SERVICES = ("planner", "executor", "validator", "governor", "escalation")


LOCKED = L.OwnLocked("tenant-reads", SERVICES, STACK_ENV, extra=f"max_payload: {MAX_PAYLOAD}")  # ``locked``


def as_user(url: str, user: str, **overrides: Any) -> Settings:
    return L.as_user(url, user, manage_streams=False, rpc_timeout_s=3, **overrides)


def scripted(run_id: str, planner: list[dict[str, Any]], **tools: Any) -> RunSubmit:
    scenario = parse_scenario(
        {"name": run_id, "task": "Do it.", "planner": planner, "tools": tools, "answer_mode": "text"}
    )
    data = scenario.model_dump(mode="json", by_alias=True)
    return RunSubmit(
        run_id=run_id, task=scenario.task, answer_mode="text", scenario=data, scenario_digest=digest_of(data)
    )


def run_id(who: str) -> str:
    return f"run-{who}-{uuid.uuid4().hex[:10]}"


CALC: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "calculator", "input": {"expression": "6*7"}, "id": "toolu_1"}]},
    {"text": "forty-two"},
]


async def raw_read(url: str, verb: str, read: RunRead, tenant: str = "acme") -> bytes:
    """The planner's answer as client_acme receives it, byte for byte."""
    nc = await nats.connect(
        url, user="client_acme", password=L.PASSWORDS["client_acme"], inbox_prefix=L.inbox_of("client_acme")
    )
    try:
        return (await nc.request(S.run_read(verb, tenant), read.model_dump_json().encode(), timeout=bound(3))).data
    finally:
        await nc.close()


# --- its own runs: submitted, waited for, read whole -------------------------------------------------------------


async def test_a_tenant_client_waits_for_its_own_run_and_reads_its_state_history_and_events(acme: Client) -> None:
    mine = run_id("acme")
    big = "x" * 300_000  # over the inline limit: stored by reference, and read so through the planner
    await acme.submit(scripted(mine, [*CALC[:1], {"text": big}]))
    state = await acme.wait(mine, timeout=bound(60))
    assert state.status == "completed" and state.final_output == big, state.final_reason
    assert [m.role for m in state.messages][:1] == ["user"] and len(state.messages) >= 4, state.messages
    assert await acme.history(mine) == state.messages
    assert await acme.history(mine, last=1) == state.messages[-1:]
    again = await acme.state(mine, history=True)
    assert again is not None and again.messages == state.messages and again.usage == state.usage
    events = await acme.events(mine)
    kinds = [e.kind for e in events]
    assert kinds[-1] == "run.completed" and "tool.succeeded.calculator" in kinds, kinds
    assert all(e.run_id == mine for e in events) and [e.seq for e in events] == sorted(e.seq for e in events)
    [done] = await acme.events(mine, subjects=S.run_event("completed"))
    assert done.payload.get("final_output", big) == big


async def test_a_long_history_comes_in_pages_that_each_fit_in_one_message(
    locked: L.Deployment, locked_client: Client, acme: Client
) -> None:
    mine = run_id("acme")
    turns = [
        {
            "text": f"part {i} " + "y" * 80_000,
            "tool_calls": [{"name": "calculator", "input": {"expression": f"{i}+1"}, "id": f"toolu_{i}"}],
        }
        for i in range(4)
    ]
    await acme.submit(scripted(mine, [*turns, {"text": "done"}]))
    state = await acme.wait(mine, timeout=bound(90))
    assert state.status == "completed", state.final_reason
    assert sum(len(m.model_dump_json()) for m in state.messages) > MAX_PAYLOAD
    assert state.messages == await locked_client.history(mine)  # what the default tenant's client reads directly
    first = await raw_read(locked.url, "history", RunRead(run_id=mine))
    page = json.loads(first)
    assert len(first) <= MAX_PAYLOAD and page["next"] is not None and 0 < len(page["items"]) < len(state.messages)
    assert await acme.events(mine) == await locked_client.events(mine)


async def test_a_tenant_clients_watch_sees_its_runs_events_as_they_come(acme: Client) -> None:
    mine = run_id("acme")
    async with await acme.watch(mine) as watch:
        await acme.submit(scripted(mine, CALC, calculator=[{"latency_s": 0.5}]))
        seen: list[str] = []
        while "run.completed" not in seen:
            event = await watch.next(timeout=bound(30))
            assert event is not None, seen
            seen.append(event.kind)
    assert "tool.succeeded.calculator" in seen, seen


async def test_a_tenant_client_checks_a_scenarios_expectations_from_its_runs_own_escalation_events(
    acme: Client,
) -> None:
    """It does not read the queue (every tenant's arguments are there): the items its run raised come from the
    run's own escalation events, so ``run_and_check`` and ``submit --wait`` of a scenario work for it too."""
    from shared.scenario import load_scenario
    from tests.support.paths import ROOT

    state, mismatches = await acme.run_and_check(load_scenario(ROOT / "scenarios" / "correction-escalates.yaml"))
    assert state.status == "awaiting_human" and mismatches == [], mismatches
    assert state.awaiting is not None and [i.kind for i in await acme._items_of(state.run_id)] == ["schema_cap"]


async def test_a_tenant_client_exports_and_replays_its_own_run(acme: Client) -> None:
    """Where scripted runs are allowed (this stack), a tenant's client replays its own export as a scripted run
    of its own tenant: read through the planner, compared from its own run's events."""
    from loopwarden.replay import replay

    mine = run_id("acme")
    await acme.submit(scripted(mine, CALC))
    assert (await acme.wait(mine, timeout=bound(60))).status == "completed"
    record = await acme.export(mine)
    assert record.config["tenant"] == "acme" and [t.tool for t in record.tool_calls] == ["calculator"]
    assert record.tool_calls[0].has_output and len(record.model_calls) == 2 and record.scenario is not None
    report = await replay(acme, record, timeout=bound(60))
    assert report.same and report.status == "completed", report.lines()
    again = await acme.state(report.replay_run)
    assert again is not None and again.tenant == "acme"


# --- another tenant's run: the same answer as a run that does not exist ------------------------------------------


async def test_another_tenants_run_is_answered_exactly_as_a_missing_one(
    locked: L.Deployment, locked_client: Client, acme: Client
) -> None:
    theirs = run_id("default")
    await locked_client.submit(scripted(theirs, CALC))
    assert (await locked_client.wait(theirs, timeout=bound(60))).status == "completed"
    nowhere = run_id("nowhere")
    for verb in S.RUN_READ_VERBS:
        got = await raw_read(locked.url, verb, RunRead(run_id=theirs))
        missing = await raw_read(locked.url, verb, RunRead(run_id=nowhere))
        assert got == missing, (verb, got[:300], missing[:300])
        assert json.loads(got)["found"] is False
    assert await acme.state(theirs) is None
    assert await acme.history(theirs) == []
    assert await acme.events(theirs) == []
    with pytest.raises(TimeoutError):
        await acme.wait(theirs, timeout=bound(1.5))
    # and the default tenant's client still reads it whole (a single-tenant deployment's client reads everything)
    assert (await locked_client.state(theirs, history=True)).messages  # type: ignore[union-attr]


# --- no direct read of the runs, the events or the queue; no other tenant's read subject ---------------------------


def refusals(errors: list[str], subject: str) -> list[str]:
    """The permissions violations among ``errors`` for publishing to ``subject`` itself (the server quotes it)."""
    said = f'publish to "{subject.lower()}"'
    return [e for e in errors if "permissions violation" in e.lower() and said in e.lower()]


async def said_or_after(said: Callable[[], object], seconds: float) -> None:
    """Returns once ``said()`` is truthy, or after ``seconds`` either way (the caller's assertions judge)."""
    with contextlib.suppress(BoundExpired):
        await eventually(said, what="the server's answer", within=seconds, every=0.02)


async def ask(nc: NatsClient, errors: list[str], subject: str, body: bytes, seconds: float) -> bytes | None:
    """A request on ``nc`` (whose error callback fills ``errors``): its answer, or None once the server refused the
    publish (no one can answer it then) or after ``seconds`` with no answer."""
    answers: list[bytes] = []

    async def on_answer(msg: Any) -> None:
        answers.append(msg.data)

    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, cb=on_answer, max_msgs=1)
    try:
        await nc.publish(subject, body, reply=inbox)
        await said_or_after(lambda: answers or refusals(errors, subject), seconds)
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    return answers[0] if answers else None


async def acme_connection(url: str, errors: list[str]) -> NatsClient:
    async def on_error(err: Exception) -> None:
        errors.append(str(err))

    return await nats.connect(
        url,
        user="client_acme",
        password=L.PASSWORDS["client_acme"],
        error_cb=on_error,
        inbox_prefix=L.inbox_of("client_acme"),
    )


async def test_a_tenant_client_gets_nothing_from_the_runs_buckets_event_stream_live_events_or_queue(
    locked: L.Deployment, locked_client: Client
) -> None:
    url = locked.url
    theirs = run_id("default")
    await locked_client.submit(scripted(theirs, CALC))
    assert (await locked_client.wait(theirs, timeout=bound(60))).status == "completed"
    asks = {  # what each asks, and what a reader with the right would get back
        f"$JS.API.DIRECT.GET.KV_{S.KV_RUNS}.$KV.{S.KV_RUNS}.{theirs}": b"",
        f"$JS.API.DIRECT.GET.KV_{S.KV_HISTORY}.$KV.{S.KV_HISTORY}.{theirs}.0": b"",
        f"$JS.API.DIRECT.GET.{S.STREAM_EVT}": json.dumps(
            {"seq": 1, "next_by_subj": f"{S.P}.evt.>", "batch": 10}
        ).encode(),
        f"$JS.API.STREAM.MSG.GET.{S.STREAM_EVT}": json.dumps({"seq": 1}).encode(),
        # the subject indexes: every run id, and what each did
        f"$JS.API.STREAM.INFO.{S.STREAM_EVT}": json.dumps({"subjects_filter": f"{S.P}.evt.>"}).encode(),
        f"$JS.API.STREAM.INFO.KV_{S.KV_RUNS}": json.dumps({"subjects_filter": ">"}).encode(),
        S.ESCALATION_LIST: b"{}",
        S.ESCALATION_SHOW: b"{}",
        S.run_read("state", "globex"): RunRead(run_id=theirs).model_dump_json().encode(),
        S.run_read("state", S.DEFAULT_TENANT): RunRead(run_id=theirs).model_dump_json().encode(),
    }
    for subject, body in asks.items():
        errors: list[str] = []
        nc = await acme_connection(url, errors)
        try:
            answers: list[bytes] = []

            async def on_answer(msg: Any, answers: list[bytes] = answers) -> None:
                answers.append(msg.data)

            inbox = nc.new_inbox()
            await nc.subscribe(inbox, cb=on_answer)
            await nc.publish(subject, body, reply=inbox)
            await nc.flush()
            # a refused publish reaches no one, so nothing can answer it once the server said so
            await said_or_after(functools.partial(refusals, errors, subject), bound(0.5))
        finally:
            await nc.close()
        refused = refusals(errors, subject)
        assert refused, (subject, errors, answers[:1])
        assert not any(theirs.encode() in a for a in answers), (subject, answers[:1])
    # live events: the subscription is refused, and nothing of the run arrives on it
    errors = []
    nc = await acme_connection(url, errors)
    got: list[str] = []
    try:

        async def on_event(msg: Any) -> None:
            got.append(msg.subject)

        await nc.subscribe(f"{S.P}.evt.>", cb=on_event)
        await nc.flush()
        await asyncio.sleep(bound(0.3))
        other = run_id("default")
        await locked_client.submit(scripted(other, CALC))
        await locked_client.wait(other, timeout=bound(60))
    finally:
        await nc.close()
    assert any("permissions violation for subscription" in e.lower() for e in errors), errors
    assert got == [], got[:5]


async def test_a_tenant_client_reads_no_other_tenants_large_body_from_the_claim_check_store(
    locked: L.Deployment, locked_client: Client
) -> None:
    """Large bodies (a long answer, a big tool result) are stored by reference in LW_PAYLOADS; every user may
    list its subjects (stream info), so each body must be readable only by those its run belongs to."""
    url, secret = locked.url, f"SECRET-{uuid.uuid4().hex}-"
    theirs = run_id("default")
    submit = scripted(theirs, [{"text": secret * (300_000 // len(secret))}])
    await locked_client.submit(submit)
    assert (await locked_client.wait(theirs, timeout=bound(60))).status == "completed"
    known = ref_for(submit.model_dump_json(by_alias=True).encode())  # the submit's body: its name can be had
    errors: list[str] = []
    nc = await acme_connection(url, errors)
    leaked: list[str] = []
    try:
        subjects: list[str] = []
        # the subject index names every body
        info = await ask(
            nc,
            errors,
            f"$JS.API.STREAM.INFO.{S.STREAM_PAYLOADS}",
            json.dumps({"subjects_filter": f"{S.PAYLOAD_PREFIX}.>"}).encode(),
            bound(1),
        )
        if info is not None:
            subjects = list((json.loads(info).get("state") or {}).get("subjects") or {})
        asks = [
            *subjects,
            S.payload_subject("client", known.sha256, 0),
            f"{S.PAYLOAD_PREFIX}.>",  # the last body stored by anyone
            f"{S.PAYLOAD_PREFIX}.planner.>",
        ]
        for subject in asks:
            got = await ask(nc, errors, f"$JS.API.DIRECT.GET.{S.STREAM_PAYLOADS}.{subject}", b"", bound(0.5))
            if secret.encode() in (got or b""):
                leaked.append(subject)
    finally:
        await nc.close()
    assert leaked == [], leaked[:3]


def test_only_the_default_tenants_client_reads_runs_directly() -> None:
    from shared.permissions import TENANT_CLIENTS, grants, rights

    all_grants = grants([])
    for user, tenant in TENANT_CLIENTS.items():
        pub, sub = rights(user, all_grants[user])
        direct = [p for p in pub if any(x in p for x in (S.KV_RUNS, S.KV_HISTORY, f".{S.STREAM_EVT}"))]
        if user == "client":
            assert direct and f"{S.P}.evt.>" in sub
            continue
        assert [p for p in direct if not p.startswith("$JS.API.STREAM.INFO.")] == [], (user, direct)
        assert sub == [f"{S.inbox_prefix(user, tenant)}.>"], (user, sub)
        assert S.ESCALATION_LIST not in pub and S.ESCALATION_SHOW not in pub, user
        reads = [S.run_read(v, tenant) for v in S.RUN_READ_VERBS]
        assert [p for p in pub if p.startswith(S.RUN_READ_PREFIX)] == [*reads, S.run_list(tenant)]
        planner_pub, _ = rights("planner", all_grants["planner"])
        assert S.people_inboxes(S.TENANT_ROLE) in planner_pub


# --- the rules, as functions ----------------------------------------------------------------------------------------


def test_a_run_is_readable_by_its_own_tenant_only() -> None:
    assert tenant_of(S.run_read("state", "acme")) == "acme"
    assert readable("acme", "acme") and not readable("acme", "globex") and not readable("globex", "acme")
    assert readable(None, S.DEFAULT_TENANT) and not readable(None, "acme")  # a run stored without a tenant


def test_an_answer_holds_what_fits_and_at_least_one_item() -> None:
    assert fit([10, 10, 10], 25) == 2
    assert fit([100, 10], 25) == 1  # one over the budget still goes alone (it is at most one message)
    assert fit([], 25) == 0 and fit([1, 1], 100) == 2


def test_several_filters_pages_are_cut_where_one_had_more_to_come() -> None:
    def m(seq: int) -> Stored:
        return Stored("s", seq, None, {}, b"{}")

    assert merge_pages([([m(1), m(4)], 0), ([m(2), m(3)], 0)]) == ([m(1), m(2), m(3), m(4)], None)
    # the second filter has more after 3: seq 4 of the first is kept for the next page (read again from 4)
    assert merge_pages([([m(1), m(4)], 0), ([m(2), m(3)], 5)]) == ([m(1), m(2), m(3)], 4)
