"""Nobody crosses a boundary (issue 23, the NATS half): each attack of the security review, made end to end
by the least-privileged user able to make it, against a private nats-server running the generated
``deploy/nats/auth.conf`` with every service as its own user - and judged by effect: the durable, the
record, the body and the run are what they would have been without the attack.

One locked stack per module (bootstrap as admin, the six services as themselves); each test uses its own
run ids. The static rules behind the fixes are walked over every generated grant at the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
import yaml
from nats.js.api import ConsumerConfig, DeliverPolicy

from loopwarden.auth_conf import all_grants
from loopwarden.client import Client, new_run_id
from loopwarden.stack import PROCESSES, LocalStack, free_port, nats_server_binary, wait_for_port
from services.planner import ids
from shared import subjects as S
from shared.bus import Bus, kv_keys, scan, scan_all
from shared.dead_letters import requeue_command
from shared.messages import DeadLetter, EscalationQuery, RunSnapshot
from shared.payloads import PayloadError
from shared.permissions import OPERATORS, TENANT_CLIENTS, rights
from shared.scenario import parse_scenario
from shared.settings import Settings
from tests.support import locked as L
from tests.support.paths import ROOT
from tests.support.stacks import TEST_ENV
from tests.support.timing import bound, polls

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

UNTRUSTED = ("client", "console", *OPERATORS, *TENANT_CLIENTS)  # users a person holds: none is a service
TENANT_BOUND = {user: tenant for user, tenant in TENANT_CLIENTS.items() if user != "client"}
DEMO = parse_scenario(yaml.safe_load((ROOT / "scenarios" / "demo.yaml").read_text()))  # judged: it has a rubric


# the module's ``locked``: the six services as themselves; a test here makes services log permission violations
LOCKED = L.OwnLocked("boundaries", PROCESSES, TEST_ENV, no_violations=False)


@pytest.fixture
def url(locked: L.Deployment) -> str:
    return locked.url


def as_user(url: str, user: str) -> Settings:
    return L.as_user(url, user, manage_streams=False, rpc_timeout_s=3)


@pytest.fixture
async def locked_client(url: str) -> AsyncIterator[Client]:
    async with Client(as_user(url, "client")) as c:
        yield c


@pytest.fixture
async def admin(url: str) -> AsyncIterator[Client]:
    async with Client(as_user(url, "admin"), identity="admin") as c:
        yield c


class Refusals:
    """The permissions violations a raw connection was sent (nats-py hands them to its error callback)."""

    def __init__(self) -> None:
        self.said: list[str] = []
        self.arrived = asyncio.Event()

    async def on_error(self, err: Exception) -> None:
        self.said.append(str(err).lower())
        self.arrived.set()

    async def of(self, subject: str, since: int) -> None:
        """Returns once a violation for publishing to ``subject`` came, among those after the first ``since``."""
        said = f'publish to "{subject.lower()}"'
        while not any(said in e for e in self.said[since:]):
            self.arrived.clear()
            await self.arrived.wait()


REFUSALS: dict[int, Refusals] = {}  # by id() of the raw connection


@contextlib.asynccontextmanager
async def raw(url: str, user: str) -> AsyncIterator[nats.NATS]:
    """A bare nats-py connection as ``user`` (what an attacker holding that password has)."""
    refusals = Refusals()
    nc = await nats.connect(
        url, user=user, password=L.PASSWORDS[user], inbox_prefix=L.inbox_of(user), error_cb=refusals.on_error
    )
    REFUSALS[id(nc)] = refusals
    try:
        yield nc
    finally:
        REFUSALS.pop(id(nc), None)
        await nc.close()


async def api(nc: nats.NATS, subject: str, body: dict[str, Any] | bytes) -> dict[str, Any] | None:
    """A JetStream API request; None when no answer came: the server refused the publish (said at once, as a
    permissions violation for the subject), or nothing answered within the bound."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    refusals = REFUSALS[id(nc)]
    since = len(refusals.said)
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, max_msgs=1)
    try:
        await nc.publish(subject, data, reply=inbox)
        refused = asyncio.ensure_future(refusals.of(subject, since))
        answered = asyncio.ensure_future(sub.next_msg(timeout=bound(0.5)))  # an allowed API request answers in ms
        await asyncio.wait({refused, answered}, return_when=asyncio.FIRST_COMPLETED)
        for task in (refused, answered):
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        if refused.done() and not refused.cancelled():
            return None
        try:
            reply = answered.result()
        except BaseException:  # timed out (or cancelled): nothing answered
            return None
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    try:
        return json.loads(reply.data) if reply.data else {"status": (reply.headers or {}).get("Status")}
    except ValueError:
        return {"raw": reply.data[:200].decode(errors="replace")}


async def completes(client: Client, run_id: str | None = None, timeout: float = bound(90)) -> RunSnapshot:
    run_id = await client.submit_scenario(DEMO, run_id=run_id)
    state = await client.wait(run_id, timeout=timeout)
    assert state.status == "completed", state.final_reason
    return state


# --- D1, D9: no one but the admin creates, updates or deletes a consumer ------------------------------


async def test_a_client_cannot_rewrite_a_services_durable(url: str, admin: Client, locked_client: Client) -> None:
    """nats-server takes a create that *names* an existing durable as an update of it (``name``, or
    ``action: update``): the client's grant has no consumer create at all, so every form is refused, the
    durable keeps its config, and runs still complete."""
    js = admin.bus.js
    before = (await js.consumer_info(S.STREAM_EVT, S.DURABLE_PLANNER_OUTCOMES)).config
    rewrites = [
        {"durable_name": S.DURABLE_PLANNER_OUTCOMES, "filter_subject": "lw.v1.evt.nothing", "ack_policy": "explicit"},
        {"name": S.DURABLE_PLANNER_OUTCOMES, "filter_subject": "lw.v1.evt.nothing", "ack_policy": "explicit"},
        {"name": S.DURABLE_ESCALATION_FAILURES, "max_deliver": 1, "ack_wait": 1_000_000, "ack_policy": "explicit"},
        {"name": S.DURABLE_PLANNER_VERDICTS, "inactive_threshold": 2_000_000_000, "ack_policy": "explicit"},
    ]
    async with raw(url, "client") as nc:
        for config in rewrites:
            name = config.get("name") or config.get("durable_name")
            for action in (None, "update"):
                body = {"stream_name": S.STREAM_EVT, "config": config} | ({"action": action} if action else {})
                for subject in (
                    f"$JS.API.CONSUMER.CREATE.{S.STREAM_EVT}",
                    f"$JS.API.CONSUMER.CREATE.{S.STREAM_EVT}.{name}",
                    f"$JS.API.CONSUMER.DURABLE.CREATE.{S.STREAM_EVT}.{name}",
                ):
                    answer = await api(nc, subject, body)
                    assert answer is None or "error" in answer, (subject, body, answer)
        assert await api(nc, f"$JS.API.CONSUMER.DELETE.{S.STREAM_EVT}.{S.DURABLE_PLANNER_VERDICTS}", b"") is None
    after = (await js.consumer_info(S.STREAM_EVT, S.DURABLE_PLANNER_OUTCOMES)).config
    assert (after.durable_name, after.filter_subjects, after.filter_subject) == (
        before.durable_name,
        before.filter_subjects,
        before.filter_subject,
    )
    failures = (await js.consumer_info(S.STREAM_EVT, S.DURABLE_ESCALATION_FAILURES)).config
    assert failures.max_deliver != 1 and failures.ack_wait != 0.001
    verdicts = (await js.consumer_info(S.STREAM_EVT, S.DURABLE_PLANNER_VERDICTS)).config
    assert verdicts.durable_name == S.DURABLE_PLANNER_VERDICTS and not verdicts.inactive_threshold
    await completes(locked_client)


@pytest.mark.parametrize("user", UNTRUSTED)
async def test_no_person_creates_a_consumer_on_any_stream(url: str, admin: Client, user: str) -> None:
    """An ephemeral reader is a consumer too: 1,000 of them fill a stream's cap (D9). History is read by
    direct get instead, so no person may create one anywhere, and the count of consumers is unchanged."""
    streams = [*S.STREAM_SUBJECTS, *(f"KV_{b}" for b in (S.KV_RUNS, S.KV_HISTORY, S.KV_ESCALATIONS))]
    js = admin.bus.js
    before = {s: (await js.stream_info(s)).state.consumer_count for s in streams}
    async with raw(url, user) as nc:
        for stream in streams:
            config = {"deliver_policy": "all", "ack_policy": "none", "inactive_threshold": 3_600_000_000_000}
            answer = await api(nc, f"$JS.API.CONSUMER.CREATE.{stream}", {"stream_name": stream, "config": config})
            assert answer is None or "error" in answer, (user, stream, answer)
    assert {s: (await js.stream_info(s)).state.consumer_count for s in streams} == before


async def test_a_client_reads_history_and_values_without_a_consumer(locked_client: Client) -> None:
    state = await completes(locked_client)
    events = await locked_client.events(state.run_id)
    assert [e.kind for e in events][-1] == "run.completed" and all(e.seq > 0 for e in events)
    assert state.messages, "the conversation is read by direct gets"


# --- D2: a reply subject is not a place to write ------------------------------------------------------


async def test_a_reply_subject_cannot_make_a_responder_write_elsewhere(url: str, locked_client: Client) -> None:
    """``rpc.escalation.show`` with reply ``$KV.lw_runs.<victim>``: with ``allow_responses`` the escalation
    service wrote its answer over the victim's record (the run never ended). Now the service answers only
    inboxes, and its grant allows no other reply subject: the record is untouched, the run completes."""
    victim = new_run_id()
    planted = f"run-reflect-{os.getpid()}"
    async with raw(url, "client") as nc:
        body = EscalationQuery(escalation_id="x").model_dump_json().encode()
        for reply in (f"$KV.{S.KV_RUNS}.{victim}", f"$KV.{S.KV_RUNS}.{planted}", f"$KV.{S.KV_CONTRACTS}.search"):
            await nc.publish(S.ESCALATION_SHOW, body, reply=reply)
        await nc.flush()
        run_id = await locked_client.submit_scenario(DEMO, run_id=victim)
        for _ in range(3):  # and again while the run is going
            await asyncio.sleep(0.3)
            await nc.publish(S.ESCALATION_SHOW, body, reply=f"$KV.{S.KV_RUNS}.{victim}")
        await nc.flush()
    state = await locked_client.wait(run_id, timeout=bound(90))
    assert state.status == "completed", state.final_reason
    await asyncio.sleep(bound(0.5))
    assert await locked_client.bus.kv_get(S.KV_RUNS, planted, RunSnapshot) == (None, 0)
    assert (await locked_client.state(victim)) is not None  # still a RunSnapshot
    await completes(locked_client)  # the contracts still read: new runs are taken


# --- D5: a client's message id cannot pre-claim a service's ----------------------------------------------


async def test_a_client_cannot_pre_claim_the_planners_next_message_id(url: str, locked_client: Client) -> None:
    """The planner's ids are predictable (``<run>.judge.<candidate>``). A client publishing junk with that id
    on the submit subject made the real judge request a duplicate on LW_CMD: the judged run waited forever.
    Submits now live in LW_SUBMIT, whose de-duplication window is its own."""
    victim = new_run_id()
    async with Client(as_user(url, "client")) as attacker:
        for n in range(1, 6):
            for msg_id in (ids.judge_request(victim, ids.candidate(victim, n)), f"{victim}.adv.{n}"):
                await attacker.bus.publish(S.run_submit(), b"{}", msg_id=msg_id)
    state = await completes(locked_client, victim)
    assert any(e.kind == "judge.verdict" for e in await locked_client.events(victim))
    assert state.status == "completed"


async def test_a_handled_submit_leaves_the_submit_stream_under_the_generated_grants(
    admin: Client, locked_client: Client
) -> None:
    """The planner's grant lets it delete messages of LW_SUBMIT and LW_CMD by their number (``Removals``): a run's
    submit is gone once the run is recorded, the commands the planner published for it once it ended; the run
    completes as before. What stays are the executor's results for the validator (the sweep removes them)."""
    state = await completes(locked_client)
    held: list[str] = []
    for _ in range(polls(50)):
        stored = [
            *await scan_all(admin.bus.nc, S.STREAM_SUBMIT, [f"{S.RUN_SUBMIT_PREFIX}.>"]),
            *await scan_all(admin.bus.nc, S.STREAM_CMD, [f"{S.P}.cmd.>"]),
        ]
        held = [m.subject for m in stored if m.headers.get("Lw-Run-Id") == state.run_id]
        if set(held) <= {S.RESULT_VALIDATE}:
            break
        await asyncio.sleep(0.1)
    assert set(held) <= {S.RESULT_VALIDATE}, f"{state.run_id} still has {held}"


# --- D6: a stored message pushed at a responder is not a request ------------------------------------------


async def test_a_responder_ignores_a_push_delivery_of_a_stored_request(url: str, admin: Client) -> None:
    """A push consumer delivering stored bytes to ``rpc.budget.reserve`` (group ``governor``) used to be
    processed as a real budget request (a run's turn blocked, a tenant's day spent). No person may create
    such a consumer any more; even the admin's is ignored by the governor (not its subject, an ack reply)."""
    victim, tenant = new_run_id(), f"acme{os.getpid()}"
    request = {
        "run_id": victim,
        "turn": 1,
        "model": "claude-sonnet-4-5",
        "sections": {},
        "spent": {"input_tokens": 1, "output_tokens": 1, "cost_usd": 999.0},
        "context_budget_tokens": 1000,
        "run_token_budget": 1000,
        "cost_ceiling_usd": 1.0,
        "tenant": tenant,
    }
    subject = S.payload_subject("admin", "f" * 64, os.getpid())
    js = admin.bus.js
    await js.publish(subject, json.dumps(request).encode(), stream=S.STREAM_PAYLOADS)
    push = ConsumerConfig(
        deliver_policy=DeliverPolicy.ALL,
        filter_subject=subject,
        deliver_subject=S.BUDGET_RESERVE,
        deliver_group="governor",
    )
    async with raw(url, "client") as nc:  # the attacker of the review may not create it
        body = {"stream_name": S.STREAM_PAYLOADS, "config": {**push.as_dict(), "ack_policy": "none"}}
        answer = await api(nc, f"$JS.API.CONSUMER.CREATE.{S.STREAM_PAYLOADS}", body)
        assert answer is None or "error" in answer, answer
    info = await js.add_consumer(S.STREAM_PAYLOADS, push)
    try:
        await asyncio.sleep(bound(2.0))
    finally:
        await js.delete_consumer(S.STREAM_PAYLOADS, info.name)
    keys = await kv_keys(admin.bus.nc, S.KV_BUDGETS)
    assert not [k for k in keys if victim in k or tenant in k], keys


# --- D8: a stored body is written once -------------------------------------------------------------------


async def test_no_one_replaces_a_stored_body(url: str) -> None:
    """The review's ``R objects``: the client replaced the meta of the planner's stored body and every message
    referring to it failed its digest check. Bodies are now written once, each user under its own name: the
    client cannot write there, a second write of the same subject is refused even for its owner, and the
    planner still reads its body; the store is bounded."""
    body = os.urandom(400_000)
    planner = Bus(as_user(url, "planner"), "planner")
    await planner.connect()
    try:
        headers: dict[str, str] = {}
        ref = await planner.payloads.offload(planner.nc, body, headers)
        async with raw(url, "client") as nc:
            with contextlib.suppress(Exception):  # the old attack: the object store's meta, replaced
                js = nc.jetstream(timeout=bound(1))  # an allowed API request answers in ms; a refused one never
                await (await js.object_store("lw_payloads")).put(headers["Lw-Payload-Ref"], b"tampered")
            for chunk in range(2):  # the planner's own chunks: not the client's to write
                errors = await L.publish_refusals(url, "client", S.payload_subject("planner", body_digest(ref), chunk))
                assert errors
        with pytest.raises(Exception, match="maximum messages per subject"):  # not even its owner rewrites it
            await planner.js.publish(S.payload_subject("planner", body_digest(ref), 0), b"tampered")
        assert await planner.payloads.inflate(planner.nc, ref, headers) == body
        async with Client(as_user(url, "client")) as client:
            assert await client.bus.payloads.inflate(client.bus.nc, ref, headers) == body
            forged = json.loads(ref) | {"owner": "client"}
            with pytest.raises(PayloadError):  # a reference to a body no one stored is that message's failure
                await client.bus.payloads.inflate(client.bus.nc, json.dumps(forged).encode(), headers)
        info = await planner.js.stream_info(S.STREAM_PAYLOADS)
        assert info.config.max_bytes == planner.settings.payload_max_bytes and info.config.discard_new_per_subject
    finally:
        await planner.broker.stop()


def body_digest(ref: bytes) -> str:
    return str(json.loads(ref)["sha256"])


# --- D20: dead letters are the operators' -----------------------------------------------------------------


async def test_the_client_cannot_read_dead_letters(url: str) -> None:
    for subject in (f"$JS.API.DIRECT.GET.{S.STREAM_DLQ}", f"$JS.API.STREAM.MSG.GET.{S.STREAM_DLQ}"):
        assert await L.publish_refusals(url, "client", subject, b'{"seq": 1}'), subject
    async with raw(url, "alice") as nc:  # an operator reads them (none yet, or some: an answer either way)
        assert await api(nc, f"$JS.API.DIRECT.GET.{S.STREAM_DLQ}", {"seq": 1, "next_by_subj": "lw.v1.dlq.>"})


# --- D3: an over-long id takes no service off the bus -----------------------------------------------------


async def test_an_over_long_id_leaves_the_escalation_service_answering(locked_client: Client) -> None:
    """``rpc.escalation.show`` with a 5,000-character id put a subject past the server's control line: the
    server closed the service's connection and nats-py never reconnected. Keys and tokens are bounded now."""
    # sent raw, as an attacker would: a query is small (its body limit refuses this one unread; the contract bounds
    # the id as well), and the service answers the refusal instead of putting the id in a subject
    raw = await locked_client.bus.nc.request(
        S.ESCALATION_SHOW, json.dumps({"escalation_id": "a" * 5000}).encode(), timeout=bound(10)
    )
    assert b"over the limit of 2048" in raw.data and b'"ok":true' not in raw.data.replace(b" ", b""), raw.data[:300]
    for _ in range(3):
        assert (await locked_client.escalations()) is not None  # NoRespondersError when the service is off the bus
        await asyncio.sleep(0.3)
    # nor can a client's own connection be made to send such a subject
    assert len(S.token("a" * 5000)) <= S.MAX_TOKEN and len(S.kv_key("a" * 5000)) <= S.MAX_KEY
    assert await locked_client.bus.kv_get(S.KV_RUNS, "r" * 5000, RunSnapshot) == (None, 0)
    assert locked_client.bus.nc.is_connected


# --- D19: a letter is handed back once --------------------------------------------------------------------


async def test_a_letter_is_requeued_once_whatever_the_message_ids(url: str, admin: Client) -> None:
    """``loopwarden dlq requeue`` de-duplicated by message id only: an operator publishing the same ``Requeue``
    with other ids ran it once per copy. The service now takes a letter back once (``lw_requeues``), refuses
    the rest with a letter saying so; and a letter number JetStream cannot read is a refusal, not a crash."""
    marker = f"test: given up {os.getpid()}"
    async with Client(as_user(url, "planner"), identity="planner") as planner:
        letter = DeadLetter(
            service="planner", subject=S.RUN_ADVANCE, reason=marker, body="{}", requeue_to=S.requeue("planner")
        )
        await planner.bus.publish(S.dead_letter("planner"), letter, msg_id=f"dlq-boundaries-{os.getpid()}")
    async with Client(as_user(url, "alice"), identity="alice") as alice:
        seq = next(n.seq for n in await alice.letters() if n.letter.reason == marker)
        for copy in range(3):
            await alice.bus.publish(S.requeue("planner"), requeue_command(seq), msg_id=f"requeue-{seq}-copy-{copy}")
        await alice.bus.publish(S.requeue("planner"), requeue_command(2**64 + 5), msg_id=f"requeue-huge-{seq}")

        def ours(letters: list[Any]) -> tuple[list[Any], list[Any], list[Any]]:
            again = [n for n in letters if n.letter.requeued_from == seq]
            refused = [
                n for n in letters if "handed back already" in n.letter.reason and f"letter {seq} " in n.letter.reason
            ]
            huge = [
                n for n in letters if "cannot be read" in n.letter.reason and str(2**64 + 5)[:20] in n.letter.reason
            ]
            return again, refused, huge

        for _ in range(polls(100)):
            again, refused, huge = ours(await alice.letters())
            if len(again) + len(refused) >= 3 and huge:
                break
            await asyncio.sleep(0.1)
        again, refused, huge = ours(await alice.letters())
        assert len(again) == 1, [n.letter.reason for n in again]  # ran once: its body failed again, once
        assert len(refused) == 2, [n.letter.reason for n in refused]
        assert len(huge) == 1 and huge[0].letter.deliveries == 1, [n.letter for n in huge]


# --- the rules, walked over every generated grant ---------------------------------------------------------


def test_every_generated_grant_keeps_the_rules() -> None:
    grants = all_grants()
    durable_streams = {stream for g in grants.values() for stream, _ in g.consumers}
    assert durable_streams <= set(S.STREAMS_WITH_DURABLES)
    for user, grant in grants.items():
        pub, sub = rights(user, grant)
        # no one but the admin creates, updates or deletes a consumer on a stream that holds a service durable,
        # nor on the dead letters or the claim-check store
        for stream in (*S.STREAM_SUBJECTS, *(f"KV_{b}" for b in grant.kv_read)):
            for verb in ("CONSUMER.CREATE", "DURABLE.CREATE", "CONSUMER.DELETE"):
                assert not any(p.startswith(f"$JS.API.{verb}.{stream}") for p in pub), (user, verb, stream)
        assert not any(p.startswith(("$JS.API.CONSUMER.CREATE.>", "$JS.API.>", "$JS.>")) for p in pub), user
        # consumers on a KV stream only for the bucket's own writer
        for p in pub:
            if p.startswith("$JS.API.CONSUMER.CREATE.KV_"):
                assert p.split(".")[4].removeprefix("KV_") in grant.kv_write, (user, p)
        # replies only to named inboxes: no allow_responses; the governor answers the planner only; the people
        # of a role (tenants' clients, operators) under that role's inboxes, never a built-in user's
        answered = {f"{S.inbox_prefix(u)}.>" for u in grant.answers} | {
            S.people_inboxes(r) for r in grant.answers_people
        }
        assert all(not p.startswith("_INBOX_") or p in answered for p in pub), user
        # only the planner starts a sub-agent run
        if user != "planner":
            assert not any(S.matches(p, f"{S.P}.cmd.run.spawn") for p in pub), user
        # claim-check bodies: only under one's own name; dead letters: operators (and admin) only
        # (and the planner under each tenant's, for that tenant's reads: ``S.tenant_bodies``)
        own_bodies = [S.token(user), *([S.TENANT_ROLE] if user == "planner" else [])]
        assert [p for p in pub if p.startswith(S.PAYLOAD_PREFIX)] == [f"{S.PAYLOAD_PREFIX}.{o}.>" for o in own_bodies]
        if user in ("client", "console"):
            reads = ("DIRECT.GET", "MSG.GET", "CONSUMER.")  # its stream info (counts) is no letter
            assert not any(S.STREAM_DLQ in p and any(r in p for r in reads) for p in pub), user
        # deleting a stored message by its number: the planner alone, a submit it handled and the commands it
        # published for a run that ended (``services/planner/removals.py``)
        deletes = [p for p in pub if ".MSG.DELETE." in p]
        mine = [f"$JS.API.STREAM.MSG.DELETE.{stream}" for stream in (S.STREAM_SUBMIT, S.STREAM_CMD)]
        assert deletes == (mine if user == "planner" else []), user
        # a person's user publishes on no stream that holds a service's message ids (LW_CMD)
        if user in UNTRUSTED:
            assert not [p for p in pub if S.stream_for(p) == S.STREAM_CMD], user
        # a client bound to a tenant reads that tenant's runs only, through the planner: nothing by direct get
        # but claim-check bodies, no live event, not the queue, and the read subjects of its own tenant only
        # (the default tenant's ``client`` is the single-tenant deployment's: it reads every run)
        if user in TENANT_BOUND:
            reads = [p for p in pub if ".GET." in p or p.endswith(".GET") or p.startswith("$KV.")]
            bodies = (user, S.tenant_bodies(TENANT_BOUND[user]))  # its own, and its tenant's reads'
            agents = f"KV_{S.KV_AGENTS}"  # the agents it runs by name: the same for every tenant
            assert reads == [
                f"$JS.API.DIRECT.GET.{agents}",
                f"$JS.API.DIRECT.GET.{agents}.>",
                f"$JS.API.STREAM.MSG.GET.{agents}",
                *(f"$JS.API.DIRECT.GET.{S.STREAM_PAYLOADS}.{S.PAYLOAD_PREFIX}.{o}.>" for o in bodies),
            ], reads
            assert sub == [f"{L.inbox_of(user)}.>"], (user, sub)
            # no subject index but its submit stream's (LW_EVT's names every run, LW_PAYLOADS' every body)
            assert [p for p in pub if p.startswith("$JS.API.STREAM.INFO.")] == [
                f"$JS.API.STREAM.INFO.{S.STREAM_SUBMIT}",
                f"$JS.API.STREAM.INFO.{agents}",
            ]
            assert not any(p.startswith(S.ESCALATION_RPC_PREFIX) for p in pub), user
            own = [S.run_read(verb, TENANT_BOUND[user]) for verb in S.RUN_READ_VERBS]
            assert [p for p in pub if p.startswith(S.RUN_READ_PREFIX)] == [*own, S.run_list(TENANT_BOUND[user])], user
        elif user != "planner":
            assert not any(S.RUN_READ_PREFIX in p for p in (*pub, *sub)), user  # the planner alone answers them
        assert f"{L.inbox_of(user)}.>" in sub
    planner = rights("planner", grants["planner"])
    # the planner answers the tenant-bound clients (their reads, their row of the fleet's view) and whoever may ask
    # for the whole fleet's view (``loopwarden fleet``: the default client, the console, the operators, the admin)
    assert {p for p in planner[0] if p.startswith("_INBOX_")} == {
        S.people_inboxes(S.TENANT_ROLE),
        S.people_inboxes(S.OPERATOR_ROLE),
        *(f"{S.inbox_prefix(u)}.>" for u in ("client", "console", "admin")),
    }
    assert f"{S.RUN_READ_PREFIX}.>" in planner[1]
    # no tenant's client inbox is under another role's, nor any service's: the escalation service answers none
    assert all(L.inbox_of(u).startswith("_INBOX_tenant.") for u in TENANT_BOUND)
    assert not {p for p in rights("escalation", grants["escalation"])[0] if p.startswith("_INBOX_tenant")}
    assert {p for p in rights("governor", grants["governor"])[0] if p.startswith("_INBOX_")} == {
        f"{S.inbox_prefix(u)}.>" for u in ("planner", "admin")
    }
    escalation = set(rights("escalation", grants["escalation"])[0])
    assert {f"{S.inbox_prefix(u)}.>" for u in ("client", "console")} | {S.people_inboxes(S.OPERATOR_ROLE)} <= escalation
    assert all(L.inbox_of(u).startswith("_INBOX_operator.") for u in OPERATORS)
    assert "allow_responses" not in (Path(__file__).parents[2] / "deploy" / "nats" / "auth.conf").read_text()


async def test_a_stream_read_by_direct_get_pages_through_everything(admin: Client) -> None:
    """``scan`` reads past one batch (the history of a long run is more than one answer)."""
    found = await scan(admin.bus.nc, S.STREAM_EVT, f"{S.EVENT_PREFIX}.>", batch=7)
    assert found and [m.seq for m in found] == sorted({m.seq for m in found})


# --- D3, the process half: a connection closed for good ends the service ----------------------------------


@pytest.fixture
def short_lines(tmp_path: Path) -> Iterator[str]:
    """A plain nats-server whose ``max_control_line`` is 320 bytes."""
    port = free_port()
    conf = tmp_path / "server.conf"
    conf.write_text(
        f'listen: "127.0.0.1:{port}"\nmax_control_line: 320\njetstream {{ store_dir: "{tmp_path / "js"}" }}\n'
    )
    server = subprocess.Popen(
        [nats_server_binary(), "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for_port(port)
        yield f"nats://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(bound(10))


async def test_a_service_whose_connection_is_closed_for_good_exits_non_zero(short_lines: str, tmp_path: Path) -> None:
    """nats-server closes a connection over a protocol error (here: a control line past a small
    ``max_control_line``, reached by the key lookup of a 250-character id - within the contract) and nats-py does not
    reconnect. The service used to stay up and off the bus; it now exits non-zero so its supervisor starts it
    again."""
    stack = LocalStack(state_dir=tmp_path, nats_url=short_lines, env=TEST_ENV, services=("escalation",))
    try:
        await asyncio.to_thread(stack.start)
        (escalation,) = stack.procs
        async with Client(Settings(nats_url=short_lines, rpc_timeout_s=2)) as asker:
            # a valid id (the contracts bound it to 256 characters) whose key lookup passes a 320-byte line
            with contextlib.suppress(Exception):
                await asker.show("a" * 250)
        code = await asyncio.to_thread(escalation.popen.wait, 30)
        assert code != 0
        assert "closed for good" in escalation.log.read_text(errors="replace")
    finally:
        await asyncio.to_thread(stack.stop)


async def test_the_console_user_keeps_its_live_view_without_a_consumer(url: str, locked_client: Client) -> None:
    """The console's runs and timelines come from direct gets and a core subscription (its grant has no
    consumer create): a run completed before it started and one completed after are both in its view."""
    from loopwarden.console.live import LiveView

    before = await completes(locked_client)
    async with Client(as_user(url, "console"), identity="console") as console:
        live = LiveView(console)
        await live.start()
        try:
            assert before.run_id in live.runs and before.run_id in live.timelines
            after = await completes(locked_client)
            for _ in range(polls(50)):
                if after.run_id in live.runs and live.runs[after.run_id].status == "completed":
                    break
                await asyncio.sleep(0.1)
            assert live.runs[after.run_id].status == "completed"
            assert after.run_id in live.timelines
        finally:
            await live.stop()
