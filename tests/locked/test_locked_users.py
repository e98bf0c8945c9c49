"""Every documented task on a locked deployment, as the user the docs name for it (issue 35, items 2, 3 and 6).

The session's locked deployment (``tests/support/locked.py``) runs every service and the console as its own NATS
user with scripted runs off, as production does. People act as their own users, through the CLI and the Python
client as the docs say: the tenant-bound client ``client_acme`` submits, waits for, lists, shows, exports and
replays its own runs; the operator ``alice`` lists and reads every run, works the queue, replays and hands dead
letters back. What a user may not do is refused in one line, exit 1, naming the user and what it may not do.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from loopwarden.client import Client, PermissionDenied
from loopwarden.fake_model import FakeModel
from shared import subjects as S
from shared.messages import RunSubmit
from shared.settings import Settings
from tests.support.locked import Deployment
from tests.support.model_turns import sql_task
from tests.support.timing import bound, polls

REFUSAL = re.compile(r"^loopwarden [a-z-]+: user \S+ may not .+: permission denied( \(.*\))?$")


def calc_task(model: FakeModel, what: str = "6*7") -> str:
    """A live task the fake model answers with one calculator call, then the result."""
    key = f"calc{uuid.uuid4().hex[:10]}"
    model.script(
        key,
        [
            {"content": [{"type": "tool_use", "id": "toolu_1", "name": "calculator", "input": {"expression": what}}]},
            {"content": [{"type": "text", "text": "the answer is 42"}]},
        ],
    )
    return f"What is {what}? [script:{key}]"


def one_line_refusal(done: Any, user: str) -> str:
    """The refusal a CLI command ended with: one line on stderr, exit 1, nothing on stdout, no traceback."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1, (done.returncode, done.stdout[-500:], done.stderr[-2000:])
    assert len(lines) == 1 and REFUSAL.match(lines[0]) and f"user {user} " in lines[0], done.stderr[-2000:]
    assert "Traceback" not in done.stderr and done.stdout == "", done.stdout[-500:]
    return lines[0]


@pytest.fixture(scope="module")
def acme_run(locked: Deployment, messages_api: FakeModel) -> str:
    done = locked.cli("client_acme", "submit", "--task", calc_task(messages_api), "--wait", "--timeout", "60")
    assert done.returncode == 0, done.stdout + done.stderr
    run_id, end = done.stdout.strip().splitlines()
    assert end == "completed: the answer is 42"
    return str(run_id)


@pytest.fixture(scope="module")
def default_run(locked: Deployment, messages_api: FakeModel) -> str:
    done = locked.cli("client", "submit", "--task", calc_task(messages_api), "--wait", "--timeout", "60")
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.splitlines()[0]


# --- the tenant's client: CLI ----------------------------------------------------------------------------------


def test_a_tenant_client_lists_reads_shows_and_exports_its_own_run_from_the_cli(
    locked: Deployment, acme_run: str, tmp_path: Path
) -> None:
    listed = locked.cli("client_acme", "runs", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert acme_run in [r["run_id"] for r in rows] and {r["tenant"] for r in rows} == {"acme"}, rows
    status = locked.cli("client_acme", "status", acme_run)
    assert status.returncode == 0 and "status:      completed" in status.stdout, status.stderr
    events = locked.cli("client_acme", "events", acme_run)
    assert events.returncode == 0 and "calculator" in events.stdout, events.stderr
    shown = locked.cli("client_acme", "show", acme_run)
    assert shown.returncode == 0 and "calculator" in shown.stdout, shown.stderr
    for args in (("trace", acme_run), ("events", acme_run, "--full"), ("show", acme_run, "--step", "1")):
        done = locked.cli("client_acme", *args)
        assert done.returncode == 0 and "calculator" in done.stdout, (args, done.stderr)
    out = tmp_path / "acme.json"
    exported = locked.cli("client_acme", "export", acme_run, "-o", str(out))
    assert exported.returncode == 0, exported.stderr
    record = json.loads(out.read_text())
    assert record["status"] == "completed" and record["config"]["tenant"] == "acme"
    assert [c["purpose"] for c in record["model_calls"]] == ["plan", "plan"], record["model_calls"]
    (call,) = record["tool_calls"]
    assert call["tool"] == "calculator" and call["has_output"] and call["raw_output"]["result"] == 42


def test_a_tenant_client_reads_another_tenants_run_as_a_missing_one(locked: Deployment, default_run: str) -> None:
    for args in (("status", default_run), ("events", default_run), ("show", default_run), ("export", default_run)):
        theirs = locked.cli("client_acme", *args)
        missing = locked.cli("client_acme", args[0], "run-nosuchrun0000")
        assert theirs.returncode == missing.returncode == 1, (args, theirs.stderr, missing.stderr)
        assert theirs.stderr.replace(default_run, "RUN") == missing.stderr.replace("run-nosuchrun0000", "RUN"), args
        assert len(theirs.stderr.strip().splitlines()) == 1 and theirs.stdout == "", theirs.stderr
    listed = locked.cli("client_acme", "runs", "--json", "--limit", "200")
    assert default_run not in listed.stdout


def test_what_only_operators_read_is_a_one_line_refusal_for_a_tenant_client(locked: Deployment) -> None:
    line = one_line_refusal(locked.cli("client_acme", "dlq"), "client_acme")
    assert "read the dead letters" in line
    line = one_line_refusal(locked.cli("client_acme", "metrics"), "client_acme")
    assert "read every run's events" in line
    line = one_line_refusal(locked.cli("client_acme", "escalations", "list"), "client_acme")
    assert f"ask {S.ESCALATION_LIST}" in line


# --- the tenant's client: Python, as docs/embedding.md writes it ------------------------------------------------


async def test_the_documented_client_connects_as_its_user_and_reads_its_tenants_runs(
    locked: Deployment, acme_run: str, default_run: str, messages_api: FakeModel
) -> None:
    async with Client(locked.settings("client_acme")) as client:  # no identity=: LW_NATS_USER names it
        assert client.identity == "client_acme" and client.bus.inbox_prefix == "_INBOX_tenant.client_acme"
        run_id = await client.submit(RunSubmit(run_id=f"run-py{uuid.uuid4().hex[:10]}", task=calc_task(messages_api)))
        state = await client.wait(run_id, timeout=bound(60))
        assert state.status == "completed" and state.tenant == "acme"
        mine = [r.run_id for r in await client.runs(limit=None)]
        assert run_id in mine and acme_run in mine and default_run not in mine
        assert [r.run_id for r in await client.runs(limit=1)] == [mine[0]]
        assert await client.runs(tenant="default") == []
        record = await client.export(run_id)
        assert record.tool_calls and record.tool_calls[0].raw_output["result"] == 42
        with pytest.raises(PermissionDenied, match=r"^user client_acme may not read the dead letters"):
            await client.letters()


# --- the operator: every run, the queue, replays, dead letters --------------------------------------------------


def test_an_operator_lists_and_reads_every_tenants_runs(
    locked: Deployment, acme_run: str, default_run: str, tmp_path: Path
) -> None:
    listed = locked.cli("alice", "runs", "--json", "--limit", "200")
    assert listed.returncode == 0, listed.stderr
    tenants = {r["run_id"]: r["tenant"] for r in json.loads(listed.stdout)}
    assert tenants.get(acme_run) == "acme" and tenants.get(default_run) == "default", tenants
    acme_only = json.loads(locked.cli("alice", "runs", "--json", "--tenant", "acme", "--limit", "200").stdout)
    assert {r["tenant"] for r in acme_only} == {"acme"}
    for args in (("status", acme_run), ("events", acme_run), ("show", acme_run), ("trace", acme_run), ("metrics",)):
        done = locked.cli("alice", *args)
        assert done.returncode == 0 and "calculator" in done.stdout + ("calculator" if args[0] == "status" else ""), (
            args,
            done.stderr,
        )
    out = tmp_path / "acme.json"
    assert locked.cli("alice", "export", acme_run, "-o", str(out)).returncode == 0
    record = json.loads(out.read_text())
    assert record["tool_calls"][0]["raw_output"]["result"] == 42 and len(record["model_calls"]) == 2


def test_an_operator_replays_a_tenants_run_with_scripted_runs_off(
    locked: Deployment, acme_run: str, tmp_path: Path
) -> None:
    out = tmp_path / "acme.json"
    assert locked.cli("alice", "export", acme_run, "-o", str(out)).returncode == 0
    done = locked.cli("alice", "replay", str(out), "--timeout", "60")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no divergence" in done.stdout, done.stdout
    replay_id = re.search(r"as (run-\S+):", done.stdout)
    assert replay_id is not None, done.stdout
    status = json.loads(locked.cli("alice", "status", replay_id.group(1), "--json").stdout)
    assert status["status"] == "completed"
    replayed = json.loads(locked.cli("alice", "runs", "--json", "--tenant", "acme", "--limit", "200").stdout)
    assert replay_id.group(1) in [r["run_id"] for r in replayed]  # charged to the replayed run's tenant


def test_an_operator_works_a_tenants_item_through_the_queue(locked: Deployment, messages_api: FakeModel) -> None:
    done = locked.cli("client_acme", "submit", "--task", sql_task(messages_api), "--wait", "--timeout", "60")
    assert done.returncode == 5, done.stdout + done.stderr  # waits for a person
    run_id = done.stdout.splitlines()[0]
    (item,) = json.loads(locked.cli("alice", "escalations", "list", "--run", run_id, "--json").stdout)
    esc = item["escalation_id"]
    assert item["tenant"] == "acme" and item["kind"] == "fatal"
    listed = locked.cli("alice", "escalations", "list", "--run", run_id)
    assert f"run {run_id}  tenant acme" in listed.stdout, listed.stdout
    shown = locked.cli("alice", "escalations", "show", esc)
    assert shown.returncode == 0 and f"escalation: {esc}" in shown.stdout and "tenant: acme" in shown.stdout
    # bob's roster has no `fatal`: the queue says so; and bob may not act as alice at all
    bob = locked.cli("bob", "escalations", "claim", esc)
    assert bob.returncode == 1 and "bob" in bob.stderr and "fatal" in bob.stderr, bob.stderr
    line = one_line_refusal(locked.cli("bob", "escalations", "claim", esc, "--as", "alice"), "bob")
    assert f"ask {S.escalation_rpc('claim', 'alice')}" in line
    assert locked.cli("alice", "escalations", "claim", esc).returncode == 0
    hidden = locked.cli("alice", "escalations", "list", "--run", run_id)
    assert "1 claimed item is not shown" in hidden.stdout, hidden.stdout
    rows = {"rows": [], "rowCount": 0, "source": "live"}
    resolved = locked.cli(
        "alice", "escalations", "resolve", esc, "--action", "provide_result", "--result", json.dumps(rows)
    )
    assert resolved.returncode == 0, resolved.stderr
    end = locked.cli("client_acme", "status", run_id, "--json")
    assert end.returncode == 0, end.stderr


def test_an_operator_hands_a_dead_letter_back_once(tmp_path: Path) -> None:
    """A letter its service took back already is not sent again: the command says so in one line, exit 1."""
    import asyncio

    import nats

    from tests.support import locked as L
    from tests.support.stacks import TEST_ENV

    async def malformed(url: str) -> None:
        user = "client_acme"
        nc = await nats.connect(url, user=user, password=L.PASSWORDS[user], inbox_prefix=L.inbox_of(user))
        await nc.jetstream().publish(S.run_submit("acme"), b'{"run_id": 7}')
        await nc.close()

    def letters(alice: dict[str, str], home: Path, count: int) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        for _ in range(polls(100)):
            found = json.loads(L.run_cli(("dlq", "--json"), alice, home, 60).stdout)
            if len(found) >= count:
                break
        return found

    with L.locked_stack(tmp_path, "requeue-once", ("planner",), TEST_ENV) as (url, _):
        home = tmp_path / "home"
        alice = {"LW_NATS_URL": url, "LW_NATS_USER": "alice", "LW_NATS_PASSWORD": L.PASSWORDS["alice"]}
        asyncio.run(malformed(url))
        (letter,) = letters(alice, home, 1)
        seq = str(letter["seq"])
        first = L.run_cli(("dlq", "requeue", seq), alice, home, 60)
        assert first.returncode == 0 and f"letter {seq} handed back to planner" in first.stdout, first.stderr
        assert len(letters(alice, home, 2)) == 2  # taken back, and dead-lettered again (it is still malformed)
        again = L.run_cli(("dlq", "requeue", seq), alice, home, 60)
        assert again.returncode == 1 and again.stdout == "", again.stdout + again.stderr
        assert len(again.stderr.strip().splitlines()) == 1 and f"letter {seq}" in again.stderr, again.stderr
        acme = {
            **alice,
            "LW_NATS_USER": "client_acme",
            "LW_NATS_PASSWORD": L.PASSWORDS["client_acme"],
            "LW_TENANT": "acme",
        }
        line = one_line_refusal(L.run_cli(("dlq", "requeue", seq), acme, home, 60), "client_acme")
        assert "read the dead letters" in line or "LW_DLQ" in line, line


# --- smaller things the walkthrough met ------------------------------------------------------------------------


@pytest.mark.parametrize("args", [("runs", "--json"), ("events", "RUN", "--json"), ("runs",)])
def test_a_reader_that_closes_the_pipe_ends_the_command_quietly(
    locked: Deployment, acme_run: str, args: tuple[str, ...]
) -> None:
    """``loopwarden runs --json | head``: the reader is gone before the command writes; it ends with exit 0 and
    nothing on stderr (no BrokenPipe traceback)."""
    import subprocess
    import sys

    from tests.support.locked import ROOT, clean_env

    argv = [a.replace("RUN", acme_run) for a in args]
    proc = subprocess.Popen(
        [sys.executable, "-m", "loopwarden.cli", *argv],
        cwd=ROOT,
        env={**clean_env(locked.home), **locked.env("alice")},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # as `head` does once it has its lines
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=bound(60)) == 0 and err == "", err


def test_an_operator_with_a_leftover_tenant_is_told_in_one_line(locked: Deployment) -> None:
    line = one_line_refusal(locked.cli("alice", "dlq", LW_TENANT="acme"), "alice")
    assert "receive replies on _INBOX_tenant.alice" in line and "LW_TENANT=acme makes it a client" in line, line


def test_every_command_is_its_users_own_connection() -> None:
    """The CLI's commands (retention as the admin, an operator's, a tenant's) connect as LW_NATS_USER: their
    inbox, the owner of the bodies they store and the name their log lines carry are that user's."""
    for user, tenant, inbox in (
        ("admin", "default", "_INBOX_admin"),
        ("alice", "default", "_INBOX_operator.alice"),
        ("client_acme", "acme", "_INBOX_tenant.client_acme"),
    ):
        client = Client(Settings(nats_url="nats://127.0.0.1:1", nats_user=user, tenant=tenant))
        assert (client.identity, client.bus.service, client.bus.inbox_prefix) == (user, user, inbox)
        assert client.bus.payloads.owner == user
    assert Client(Settings(nats_url="nats://127.0.0.1:1")).identity == "client"  # an open stack's


async def test_a_client_before_bootstrap_raises_within_its_bound_and_a_wrong_password_at_once(
    tmp_path: Path,
) -> None:
    import time

    from loopwarden.client import Unreachable
    from tests.support import locked as L

    with L.locked_server(tmp_path, "unbootstrapped") as url:
        started = time.monotonic()
        with pytest.raises(Unreachable, match=r"JetStream was not ready.*bootstrap"):
            async with Client(L.as_user(url, "client_acme", tenant="acme"), ready_timeout=bound(2)):
                pass
        assert time.monotonic() - started < bound(10)
        with pytest.raises(Unreachable, match="cannot reach NATS"):
            async with Client(L.as_user(url, "client_acme").model_copy(update={"nats_password": None})):
                pass


def test_an_over_long_run_id_is_no_run_for_every_user(locked: Deployment) -> None:
    long = "a" * 5000
    for user in ("client_acme", "alice"):
        for args in (("status", long), ("events", long), ("export", long), ("show", long)):
            done = locked.cli(user, *args)
            assert done.returncode == 1 and "Traceback" not in done.stderr, (user, args, done.stderr[-500:])
            assert len(done.stderr.strip().splitlines()) == 1, (user, args, done.stderr[-500:])
