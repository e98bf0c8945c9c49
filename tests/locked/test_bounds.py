"""Size limits by their effect (security review 4: N2, N5, L4): what a least-privileged user sends or stores
cannot make a service fetch what it will refuse, cut a service off, or make the shared store hold more than its
bounds say.

A private nats-server runs the generated deploy/nats/auth.conf (monitoring on loopback, to read how many bytes
the server sent each service's connection), bootstrapped as admin with small bounds for LW_SUBMIT and LW_DLQ;
every service runs as its own NATS user.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from nats.js.api import DiscardPolicy

from loopwarden.client import Client
from loopwarden.stack import LocalStack, free_port
from shared import subjects as S
from shared.messages import FINAL_STATUSES, Agent, AgentRecord, ErrorReply, EscalationQuery, RunRead, RunSubmit
from shared.payloads import KV_REF_KEY, REF_HEADER, PayloadStore
from shared.permissions import operator_roster
from shared.scenario import parse_scenario
from shared.settings import Settings
from tests.support import locked as L
from tests.support.runs import submit
from tests.support.stacks import TEST_ENV
from tests.support.timing import bound

SERVICES = ("planner", "executor", "validator", "governor", "escalation")
MIB = 1024 * 1024
SUBMIT_BOUND, DLQ_BOUND = 16 * MIB, 2 * MIB
BOUNDS = {"LW_STREAM_MAX_BYTES": json.dumps({"LW_SUBMIT": SUBMIT_BOUND, "LW_DLQ": DLQ_BOUND})}
HUGE = 63 * MIB + 512 * 1024  # the review's 63.5 MB request body
FETCHED_AT_MOST = 8 * MIB  # what a service may be sent while refusing such a body (the chunks are 256 KiB)


@pytest.fixture(scope="module")
def bounded_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, LocalStack, int]]:
    tmp = tmp_path_factory.mktemp("bounds")
    monitor = free_port()
    env = {s: {"LW_OPERATORS": operator_roster(), **BOUNDS} for s in SERVICES}
    with pytest.MonkeyPatch.context() as mp:
        for name, value in BOUNDS.items():  # bootstrap (as admin, in this process) declares the streams so
            mp.setenv(name, value)
        with L.locked_stack(tmp, "bounds", SERVICES, TEST_ENV, env, extra=f"http: 127.0.0.1:{monitor}") as (url, st):
            yield url, st, monitor


@pytest.fixture(scope="module")
def url(bounded_stack: tuple[str, LocalStack, int]) -> str:
    return bounded_stack[0]


def as_user(url: str, user: str, **overrides: Any) -> Settings:
    return L.as_user(url, user, manage_streams=False, rpc_timeout_s=bound(10), **overrides)


@pytest.fixture
async def bounded_client(url: str) -> AsyncIterator[Client]:
    async with Client(as_user(url, "client"), identity="client") as c:
        yield c


def sent_to(monitor: int, service: str) -> int:
    """Bytes the server has sent every connection of ``service`` (open or closed: one cut off counts too)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{monitor}/connz?state=any&limit=10000", timeout=bound(5)) as r:
        conns = json.loads(r.read())["connections"] or []
    return sum(int(c.get("out_bytes") or 0) for c in conns if c.get("name") == f"loopwarden-{service}")


def cut_off(stack: LocalStack, service: str) -> list[str]:
    """What the service logged about losing its connection."""
    text = "".join(p.log.read_text(errors="replace") for p in stack.procs if p.service == service)
    return [line for line in text.splitlines() if "disconnected from NATS" in line or "closed for good" in line]


async def store(nc: Any, settings: Settings, owner: str, body: bytes) -> dict[str, Any]:
    """Store ``body`` by reference under ``owner``'s own payload subjects (what any user may do); its reference."""
    ref = await PayloadStore(settings, owner).put(nc, body)
    return ref.model_dump()


async def timed_run(client: Client, name: str) -> float:
    """A small run of the default tenant with one tool call: its seconds from submit to completed."""
    scenario = parse_scenario(
        {
            "name": name,
            "task": "What is 6*7?",
            "planner": [{"tool_calls": [{"name": "calculator", "input": {"expression": "6*7"}}]}, submit("42")],
        }
    )
    started = time.monotonic()
    state = await client.run_scenario(scenario, timeout=bound(60))
    assert state.status == "completed", state.final_reason
    return time.monotonic() - started


# --- N2: a huge request body, by reference ----------------------------------------------------------------
async def test_a_tenants_huge_read_by_reference_is_refused_unfetched_and_other_tenants_runs_go_on(
    bounded_stack: tuple[str, LocalStack, int], bounded_client: Client
) -> None:
    url, stack, monitor = bounded_stack
    async with Client(as_user(url, "client_acme", tenant="acme"), identity="client_acme") as acme:
        read = RunRead(run_id="run-anything").model_dump_json().encode()
        ref = await store(acme.bus.nc, acme.bus.settings, "client_acme", read + b" " * (HUGE - len(read)))
        assert ref["size"] == HUGE
        before = sent_to(monitor, "planner")

        async def ask() -> ErrorReply:
            reply = await acme.bus.nc.request(
                S.run_read("state", "acme"),
                json.dumps(ref).encode(),
                timeout=bound(10),
                headers={REF_HEADER: ref["name"]},
            )
            return ErrorReply.model_validate_json(reply.data)

        asking = asyncio.gather(*(ask() for _ in range(8)))
        runs = asyncio.gather(*(timed_run(bounded_client, f"n2-{n}") for n in range(3)))  # the default tenant meanwhile
        answers, took = await asyncio.gather(asking, runs)
    assert all("over the limit of 2048" in a.error for a in answers), answers[0].error
    assert sent_to(monitor, "planner") - before < FETCHED_AT_MOST  # 8 x 63.5 MB were never fetched
    assert cut_off(stack, "planner") == []
    assert max(took) < bound(10), took  # not an ack wait (30 s) behind a planner cut off


async def test_a_huge_queue_listing_by_reference_is_refused_unfetched(
    bounded_stack: tuple[str, LocalStack, int], bounded_client: Client
) -> None:
    _, stack, monitor = bounded_stack
    query = EscalationQuery().model_dump_json().encode()
    ref = await store(bounded_client.bus.nc, bounded_client.bus.settings, "client", query + b" " * (HUGE - len(query)))
    before = sent_to(monitor, "escalation")
    replies = await asyncio.gather(
        *(
            bounded_client.bus.nc.request(
                S.ESCALATION_LIST, json.dumps(ref).encode(), timeout=bound(10), headers={REF_HEADER: ref["name"]}
            )
            for _ in range(4)
        )
    )
    for reply in replies:
        assert json.loads(reply.data)["ok"] is False and "over the limit" in json.loads(reply.data)["error"]
    assert sent_to(monitor, "escalation") - before < FETCHED_AT_MOST
    assert cut_off(stack, "escalation") == []
    listed = await bounded_client.escalations("all")  # the queue answers as before
    assert listed.ok, listed.error


# --- L4: a huge agent value, by reference --------------------------------------------------------------------
async def test_a_huge_agent_value_is_refused_unfetched_and_the_planner_is_not_stalled(
    bounded_stack: tuple[str, LocalStack, int], url: str, bounded_client: Client
) -> None:
    _, stack, monitor = bounded_stack
    name = f"heavy-{uuid.uuid4().hex[:6]}"
    record = AgentRecord(agent=Agent(name=name, instructions="be brief"), version=1, digest="0" * 64)
    data = record.model_dump_json(by_alias=True).encode()
    # The review made it as an operator, who no longer writes lw_agents (agents are registered through the
    # escalation service now): written as whoever still may, the admin - the planner must hold either way.
    async with Client(as_user(url, "admin"), identity="admin") as admin:
        ref = await store(admin.bus.nc, admin.bus.settings, "admin", data + b" " * (40 * MIB - len(data)))
        await (await admin.bus.kv(S.KV_AGENTS)).put(name, json.dumps({KV_REF_KEY: ref}).encode())
    before = sent_to(monitor, "planner")
    heavy = [f"run-heavy-{uuid.uuid4().hex[:8]}" for _ in range(4)]
    for run_id in heavy:
        await bounded_client.submit(RunSubmit(run_id=run_id, task="Say hi.", agent=name), accepted=False)
    took = await timed_run(bounded_client, "l4-other")  # another agent's run, meanwhile
    for run_id in heavy:
        state = await bounded_client.wait(run_id, timeout=bound(30), until=FINAL_STATUSES)
        assert state.status == "refused", (state.status, state.final_reason)
        assert f"agent {name!r} is stored but cannot be read" in (state.final_reason or ""), state.final_reason
        assert "LW_VALUE_MAX_BYTES" in (state.final_reason or ""), state.final_reason
    assert sent_to(monitor, "planner") - before < FETCHED_AT_MOST  # 40 MB x 4 were never fetched
    assert took < bound(10), took
    assert cut_off(stack, "planner") == []


# --- N5: what a client makes the store keep ----------------------------------------------------------------
async def test_a_client_cannot_make_the_submit_or_dead_letter_streams_hold_more_than_their_bounds(
    url: str,
) -> None:
    async with Client(as_user(url, "admin"), identity="admin") as admin:
        js = admin.bus.js
        before = (await js.stream_info(S.STREAM_SUBMIT)).state
        accepted = refused = 0
        async with Client(as_user(url, "client_acme", tenant="acme"), identity="client_acme") as acme:
            junk = b"x" * (900 * 1024)  # malformed: each is also a dead letter (its body cut to 256 KiB)
            for n in range(40):  # 36 MB from one client, as fast as it can, straight to the stream
                headers = {"Nats-Msg-Id": f"junk-{uuid.uuid4().hex}-{n}"}
                reply = await acme.bus.nc.request(S.run_submit("acme"), junk, timeout=bound(5), headers=headers)
                error = json.loads(reply.data).get("error")
                if error is None:
                    accepted += 1
                else:
                    assert "maximum bytes exceeded" in str(error.get("description")).lower(), error
                    refused += 1
        assert refused > 0 and accepted > 0, (accepted, refused)
        after = (await js.stream_info(S.STREAM_SUBMIT)).state
        assert after.bytes <= SUBMIT_BOUND, after.bytes
        assert after.messages == before.messages + accepted  # refused at the door: nothing accepted was dropped
        for _ in range(3):  # the planner has dead-lettered what it was handed
            await asyncio.sleep(bound(1))
        dlq = (await js.stream_info(S.STREAM_DLQ)).state
        assert dlq.bytes <= DLQ_BOUND, dlq.bytes
        info = await js.stream_info(S.STREAM_SUBMIT)
        assert info.config.max_bytes == SUBMIT_BOUND and info.config.discard == DiscardPolicy.NEW, info.config
        await js.purge_stream(S.STREAM_SUBMIT)  # room again for whatever runs after this module
