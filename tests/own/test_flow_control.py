"""Flow control end to end (issue 34): runs wait for their tenant's share of the fleet and start when a slot frees,
fairly between tenants and by priority within one; every quota refuses a submit at the door with its figures,
through the client and the CLI; a daily ceiling set during the day counts the whole day's spend; the fleet's
view in the CLI and in the console (headless Chromium).

One stack: one planner replica and a fleet capacity of 2 runs, so waiting is easy to cause, and a few tenants
with small quotas (``LW_TENANTS``)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import yaml
from playwright.async_api import async_playwright, expect

from loopwarden.client import Client, QuotaExceeded, Refused
from loopwarden.console.auth import hash_password
from loopwarden.stack import LocalStack
from shared import subjects as S
from shared.access import parse_access
from shared.bus import RUN_ID_HEADER
from shared.flow import TenantDay, day_key, today
from shared.live_config import store_access
from shared.messages import RunSubmit
from shared.scenario import parse_scenario
from shared.settings import Settings
from tests.support.paths import ROOT
from tests.support.runs import escalations_of
from tests.support.stacks import TEST_ENV, running
from tests.support.timing import bound, eventually

CHROMIUM = "/usr/bin/chromium-headless-shell"
PASSWORD = "alice-pw-7"
POLICIES: dict[str, dict[str, Any]] = {
    "quota": {"max_runs": 1},
    "humans": {"max_human_items": 1},
    "bytes": {"max_stored_bytes": 1024},
    "heavy": {"weight": 1},
}
ENV = {
    **TEST_ENV,
    "LW_TENANT_DAILY_CEILING_USD": "1000",  # no ceiling in the way unless a test sets one
    "LW_FLOW_CAPACITY": "2",
    "LW_FLOW_SWEEP_S": "0.5",
    "LW_FLOW_GRACE_S": "3",
    "LW_TENANTS": json.dumps(POLICIES),
    "LW_ESCALATION_SWEEP_S": "0.2",
    "LW_CONSOLE_USERS": json.dumps({"alice": hash_password(PASSWORD, rounds=4)}),
    "LW_CONSOLE_PORT": "0",
    "LW_CONFIG_REFRESH_S": "0.2",  # an applied access file is read again this often
}
CORRECTION = yaml.safe_load((ROOT / "scenarios" / "correction-escalates.yaml").read_text())


def slow(seconds: float, name: str = "slow") -> dict[str, Any]:
    """A run that holds its slot for about ``seconds``: one model turn that long, then the answer."""
    return {
        "name": name,
        "task": f"Wait {seconds}s, then say done.",
        "planner": [{"latency_s": seconds, "text": "done"}],
    }


def tenant(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def flow_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    yield from running(
        LocalStack(
            state_dir=tmp_path_factory.mktemp("flow"),
            env=ENV,
            services=("planner", "executor", "validator", "judge", "governor", "escalation", "console"),
        )
    )


@pytest.fixture
async def flow_client(flow_stack: LocalStack) -> AsyncIterator[Client]:
    async with Client(Settings(nats_url=flow_stack.nats_url)) as c:
        yield c


async def submit(client: Client, scenario: dict[str, Any], tenant: str, priority: int | None = None) -> str:
    """Submit ``scenario`` for ``tenant`` (an unlocked stack lets the default client publish any tenant's
    subject); its run id once a planner accepted it."""
    sc = parse_scenario(scenario)
    data = sc.model_dump(mode="json", by_alias=True)
    from shared.canonical import digest_of

    run = RunSubmit(
        run_id=f"run-{uuid.uuid4().hex[:20]}",
        task=sc.task,
        answer_mode=sc.answer_mode,
        scenario=data,
        scenario_digest=digest_of(data),
        tenant=tenant,
        priority=priority,
    )
    return await client.submit(run)


async def idle(client: Client) -> None:
    """Wait until no run holds a slot (an earlier test's runs have ended)."""

    async def empty() -> bool:
        view = await client.fleet()
        return view.running == 0 and view.queued == 0

    await eventually(empty, what="an idle fleet", within=bound(60), every=0.2)


# --- admission ---------------------------------------------------------------------------------------------
async def test_a_queued_run_starts_when_a_slot_frees_fairly_between_tenants_and_by_priority(
    flow_client: Client,
) -> None:
    await idle(flow_client)
    heavy, light = "heavy", tenant("light")
    started: dict[str, float] = {}
    loop = asyncio.get_running_loop()

    async def on_start(msg: Any) -> None:
        started.setdefault((msg.headers or {}).get(RUN_ID_HEADER, ""), loop.time())

    sub = await flow_client.bus.nc.subscribe(S.any_run(S.run_event("started")), cb=on_start)
    try:
        # the fleet's 2 slots, freed one after the other
        hold = [await submit(flow_client, slow(2.5), heavy), await submit(flow_client, slow(4.0), heavy)]
        low = await submit(flow_client, slow(2.0), heavy, priority=1)
        high = await submit(flow_client, slow(2.0), heavy, priority=9)
        mid = await submit(flow_client, slow(2.0), heavy)
        other = await submit(flow_client, slow(2.0), light)  # submitted last, of a tenant with nothing running
        for run_id in (low, high, mid, other):
            snap = await flow_client.state(run_id)
            assert snap is not None and snap.status == "queued", snap
        assert (await flow_client.state(high)).priority == 9  # type: ignore[union-attr]
        view = await flow_client.fleet()
        row = next(t for t in view.tenants if t.tenant == heavy)
        assert (view.capacity, row.running, row.queued, row.queued_by_priority) == (2, 2, 3, {"9": 1, "5": 1, "1": 1})
        ends = [await flow_client.wait(r, timeout=bound(60)) for r in (*hold, low, high, mid, other)]
        assert [s.status for s in ends] == ["completed"] * 6
        order = sorted((low, high, mid, other), key=lambda r: started[r])
        # a freed slot goes to the tenant with fewer runs in flight first, then the heavy one's by priority
        assert order == [other, high, mid, low], order
        waited = {s.run_id: s.waited_s for s in ends}
        assert waited[other] > 1.0 and waited[low] > waited[high]
        events = [e.kind for e in await flow_client.events(low)]
        assert events[:2] == ["run.queued", "run.started"]
    finally:
        await sub.unsubscribe()


# --- quotas at the door --------------------------------------------------------------------------------------
async def test_each_quota_refuses_a_submit_at_once_naming_its_limit_and_the_current_figure(flow_client: Client) -> None:
    # max_runs: one run in flight (or queued) is the quota
    first = await submit(flow_client, slow(2.0), "quota")
    with pytest.raises(QuotaExceeded) as runs:
        await submit(flow_client, slow(0.1), "quota")
    assert (runs.value.quota, runs.value.limit, runs.value.current) == ("max_runs", 1, 1)
    refused = await flow_client.state(runs.value.run_id)
    assert refused is not None and refused.status == "refused" and refused.refusal is not None
    assert refused.refusal.quota == "max_runs" and "its quota is 1" in refused.refusal.reason
    assert [e.kind for e in await flow_client.events(runs.value.run_id)] == ["run.refused"]
    with pytest.raises(QuotaExceeded):  # waiting on it says the same
        await flow_client.wait(runs.value.run_id, timeout=bound(5))
    assert (await flow_client.wait(first, timeout=bound(30))).status == "completed"  # nothing accepted was dropped
    assert await submit(flow_client, slow(0.1), "quota")  # room again

    # max_human_items: one open item in the human queue
    waiting = await submit(flow_client, CORRECTION, "humans")
    await flow_client.wait(waiting, timeout=bound(30), until=("awaiting_human",))
    assert len(await escalations_of(flow_client, waiting)) == 1

    async def refused_for_people() -> QuotaExceeded | None:
        try:
            run_id = await submit(flow_client, slow(0.1), "humans")
        except QuotaExceeded as err:
            return err
        await flow_client.wait(run_id, timeout=bound(30))
        return None

    people = await eventually(refused_for_people, what="a refusal for the human queue", within=bound(15), every=0.3)
    assert (people.quota, people.limit, people.current) == ("max_human_items", 1, 1)

    # max_stored_bytes: what the tenant's ended runs keep
    assert (
        await flow_client.wait(await submit(flow_client, slow(0.1), "bytes"), timeout=bound(30))
    ).status == "completed"

    async def refused_for_bytes() -> QuotaExceeded | None:
        try:
            await flow_client.wait(await submit(flow_client, slow(0.1), "bytes"), timeout=bound(30))
        except QuotaExceeded as err:
            return err
        return None

    stored = await eventually(refused_for_bytes, what="a refusal for stored bytes", within=bound(15), every=0.3)
    assert stored.quota == "max_stored_bytes" and stored.limit == 1024 and (stored.current or 0) > 1024


def cli(stack: LocalStack, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loopwarden.cli", *args],
        env={**os.environ, "LW_NATS_URL": stack.nats_url or "", **(env or {})},
        capture_output=True,
        text=True,
        timeout=bound(90),
    )


async def test_the_cli_says_a_refusal_in_one_line_and_exits_1(
    flow_stack: LocalStack, flow_client: Client, tmp_path: Any
) -> None:
    path = tmp_path / "slow.yaml"
    # the first run must still hold the quota's one slot when the second CLI (a new process: 1-4 s to start on a
    # loaded machine) submits
    path.write_text(yaml.safe_dump(slow(8.0)))
    env = {"LW_TENANT": "quota"}  # a client of tenant quota (tenant-bound: it reads through the planner)
    ok = cli(flow_stack, "submit", "--scenario", str(path), env=env)
    assert ok.returncode == 0, ok.stderr
    again = cli(flow_stack, "submit", "--scenario", str(path), "--wait", env=env)
    assert again.returncode == 1, again.stdout + again.stderr
    lines = again.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("loopwarden submit: run run-"), again.stderr
    assert "refused: tenant quota has 1 runs queued" in lines[0] and "(quota max_runs: limit 1, current 1)" in lines[0]
    assert "Traceback" not in again.stderr
    # a run of an agent that does not exist is one line too (not a quota)
    agent = cli(flow_stack, "run", "no-such-agent", "--task", "hi", env={"LW_TENANT": tenant("t")})
    assert agent.returncode == 1 and "agent 'no-such-agent' is not registered" in agent.stderr
    assert len(agent.stderr.strip().splitlines()) == 1
    assert (await flow_client.wait(ok.stdout.strip(), timeout=bound(30))).status == "completed"
    fleet = cli(flow_stack, "fleet", "--json")
    assert fleet.returncode == 0, fleet.stderr
    view = json.loads(fleet.stdout)
    assert view["capacity"] == 2 and any(t["tenant"] == "quota" for t in view["tenants"])
    quota = next(t for t in view["tenants"] if t["tenant"] == "quota")
    assert {"quota": "max_runs", "limit": 1.0, "current": 0.0} in quota["quotas"]
    text = cli(flow_stack, "fleet")
    assert text.returncode == 0 and text.stdout.startswith("fleet: ") and "quota " in text.stdout


# --- the daily ceiling --------------------------------------------------------------------------------------
async def test_a_ceiling_set_during_the_day_counts_the_whole_days_spend_and_refuses_at_submit(
    flow_stack: LocalStack, flow_client: Client
) -> None:
    spender = tenant("spender")
    done = await flow_client.wait(await submit(flow_client, slow(0.1), spender), timeout=bound(30))
    assert done.status == "completed" and done.usage.cost_usd > 0

    # no ceiling names this tenant, yet its day is kept
    async def spent() -> float:
        day, _ = await flow_client.bus.kv_get(S.KV_BUDGETS, day_key(spender, today()), TenantDay)
        return day.spent_usd if day is not None else 0.0

    assert await eventually(spent, what="the tenant's day", within=bound(10)) == pytest.approx(done.usage.cost_usd)
    # now a ceiling below what it spent today: the planner is restarted with it
    planner = next(p for p in flow_stack.procs if p.service == "planner" and p.popen.poll() is None)
    planner.popen.terminate()
    planner.popen.wait(bound(30))
    policies = {**POLICIES, spender: {"daily_ceiling_usd": done.usage.cost_usd / 2}}
    fresh = flow_stack.start_service("planner", extra_env={"LW_TENANTS": json.dumps(policies)}, label="planner-ceiling")
    flow_stack.wait_ready([fresh])
    with pytest.raises(QuotaExceeded) as ceiling:
        await submit(flow_client, slow(0.1), spender)
    assert ceiling.value.quota == "daily_ceiling_usd"
    assert ceiling.value.current == pytest.approx(done.usage.cost_usd, abs=1e-6)
    assert "reached its daily cost ceiling" in ceiling.value.reason
    assert isinstance(ceiling.value, Refused)
    # another tenant is not affected
    assert (
        await flow_client.wait(await submit(flow_client, slow(0.1), tenant("other")), timeout=bound(30))
    ).status == "completed"


# --- seeing it -------------------------------------------------------------------------------------------------
@pytest.mark.skipif(not shutil.which(CHROMIUM) and not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} missing")
async def test_the_console_shows_the_fleet_and_a_runs_priority_and_refusal(
    flow_stack: LocalStack, flow_client: Client
) -> None:
    await idle(flow_client)
    busy = tenant("busy")
    holding = [await submit(flow_client, slow(4.0), busy) for _ in range(2)]
    queued = await submit(flow_client, slow(0.1), busy, priority=8)
    first = await submit(flow_client, slow(1.0), "quota")
    with pytest.raises(QuotaExceeded) as refused:
        await submit(flow_client, slow(0.1), "quota")
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = await browser.new_page()
        page.set_default_timeout(15_000)
        await page.goto(f"{flow_stack.console_url}/fleet")
        await page.fill("input[name=operator]", "alice")
        await page.fill("input[name=password]", PASSWORD)
        await page.click("button[type=submit]")
        await expect(page.locator("#fleet-capacity")).to_have_text("2")
        row = page.locator(f"tr[data-tenant='{busy}']")
        await expect(row.locator("td.running")).to_have_text("2")
        await expect(row.locator("td.queued")).to_have_text("1")
        await expect(row).to_contain_text("p8: 1")
        await expect(page.locator("tr[data-tenant='quota'] [data-quota='max_runs']")).to_contain_text("/ 1")
        await page.goto(f"{flow_stack.console_url}/runs/{queued}")
        await expect(page.locator("#run-status")).to_have_text("queued")
        await expect(page.locator("#run-priority")).to_have_text("8")
        await expect(page.locator("#run-tenant")).to_have_text(busy)
        await page.goto(f"{flow_stack.console_url}/runs/{refused.value.run_id}")
        await expect(page.locator("#run-status")).to_have_text("refused")
        await expect(page.locator("#run-refusal")).to_contain_text("quota max_runs")
        await browser.close()
    for run_id in (*holding, queued, first):
        assert (await flow_client.wait(run_id, timeout=bound(60))).status == "completed"


# --- tenants as configuration ----------------------------------------------------------------------------------
async def test_a_tenants_policy_applied_in_the_access_file_holds_at_the_door_without_a_restart(
    flow_client: Client,
) -> None:
    # last in the module: the applied file is the stack's roster and console logins from here on
    name = tenant("applied")
    holding = await submit(flow_client, slow(2.0), name)  # no quota for it yet
    assert await submit(flow_client, slow(0.1), name)
    access = parse_access(
        {
            "tenants": {name: {"policy": {"max_runs": 1}}},
            "operators": {"alice": {"console_password_hash": hash_password(PASSWORD, rounds=4)}},
        }
    )
    await store_access(flow_client.bus, access, applied_by="test")

    async def refused() -> QuotaExceeded | None:
        try:
            run_id = await submit(flow_client, slow(0.1), name)
        except QuotaExceeded as err:
            return err
        await flow_client.wait(run_id, timeout=bound(30))
        return None

    told = await eventually(refused, what="the applied quota", within=bound(15), every=0.3)
    assert (told.quota, told.limit) == ("max_runs", 1), told
    view = await flow_client.fleet()
    row = next(t for t in view.tenants if t.tenant == name)
    assert any(q.quota == "max_runs" and q.limit == 1 for q in row.quotas), row.quotas
    assert (await flow_client.wait(holding, timeout=bound(30))).status == "completed"  # nothing accepted is dropped
