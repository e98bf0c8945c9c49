"""The operator console in a real browser, and the queue's clocks (leases, SLAs) end to end.

A private stack — nats-server, every service and the console — runs with short leases and a short
SLA for loop escalations, an operator roster (alice: every kind; bob: not_judged only) and console
logins. Playwright drives Debian's chromium-headless-shell (``make test`` installs it).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from playwright.async_api import Browser, Page, async_playwright, expect

from loopwarden.client import Client
from loopwarden.console.auth import hash_password
from loopwarden.stack import LocalStack
from shared import subjects as S
from shared.messages import Escalation
from shared.scenario import parse_scenario
from shared.settings import Settings
from tests.support.console import CHROMIUM, CHROMIUM_FLAGS
from tests.support.otlp_collector import OtlpCollector
from tests.support.paths import ROOT
from tests.support.runs import escalations_of
from tests.support.stacks import TEST_ENV, running
from tests.support.timing import bound

PASSWORDS = {"alice": "alice-pw-7", "bob": "bob-pw-7"}
JAEGER = "http://jaeger.invalid:16686"
LEASE_S = 3.0
SLA_S = 6.0
CORRECTION = yaml.safe_load((ROOT / "scenarios" / "correction-escalates.yaml").read_text())
SAME = {"tool_calls": [{"name": "calculator", "input": {"expression": "3*3"}}]}
LOOP = {"name": "loop-sla", "task": "3*3?", "planner": [SAME] * 5, "limits": {"loop_policy": "escalate"}}
CHARGE = {
    "name": "ask-human-sla",
    "task": "Charge cus_ada1 12.00 USD.",
    "planner": [
        {
            "tool_calls": [
                {"name": "charge_card", "input": {"customer_id": "cus_ada1", "amount_cents": 1200, "currency": "usd"}}
            ]
        },
        {
            "tool_calls": [
                {"name": "submit_result", "input": {"answer": "Not charged: the gateway was down, nobody answered."}}
            ]
        },
    ],
    "tools": {"charge_card": [{"fail": "transient", "error": "payment gateway 503", "times": "always"}]},
}
UNJUDGED = yaml.safe_load((ROOT / "scenarios" / "judge-unparseable.yaml").read_text())

pytestmark = pytest.mark.skipif(
    not shutil.which(CHROMIUM) and not os.path.exists(CHROMIUM),
    reason=f"{CHROMIUM} missing: `make test` installs it (apt-get install -y chromium-headless-shell)",
)


@pytest.fixture(scope="module")
def human_stack(tmp_path_factory: pytest.TempPathFactory, otlp: OtlpCollector) -> Iterator[LocalStack]:
    env = {
        **TEST_ENV,
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint,  # a run has a trace to link to only when spans are exported
        "LW_ESCALATION_LEASE_S": str(LEASE_S),
        "LW_ESCALATION_SWEEP_S": "0.2",
        "LW_ESCALATION_SLAS": json.dumps(
            {
                "loop": {"after_s": SLA_S, "action": "abort"},
                "ask_human": {"after_s": SLA_S, "action": "fall_back"},
                "not_judged": {"after_s": SLA_S, "action": "accept_if_judged"},
            }
        ),
        "LW_OPERATORS": json.dumps({"alice": ["*"], "bob": ["not_judged"]}),
        "LW_CONSOLE_USERS": json.dumps({u: hash_password(p, rounds=4) for u, p in PASSWORDS.items()}),
        "LW_CONSOLE_PORT": "0",  # any free port: the stack reads the real one from the ready line
        "LW_JAEGER_URL": JAEGER,
    }
    yield from running(
        LocalStack(
            state_dir=tmp_path_factory.mktemp("human"),
            env=env,
            services=("planner", "executor", "validator", "judge", "governor", "escalation", "console"),
        )
    )


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield b
        await b.close()


@pytest.fixture
async def human_client(human_stack: LocalStack) -> AsyncIterator[Client]:
    async with Client(Settings(nats_url=human_stack.nats_url)) as c:
        yield c


async def logged_in(browser: Browser, stack: LocalStack, operator: str, path: str = "/queue") -> Page:
    page = await browser.new_page()
    page.set_default_timeout(15_000)
    await page.goto(f"{stack.console_url}{path}")
    await expect(page).to_have_url(re.compile(r"/login\?next="))  # not logged in yet: sent to log in first
    await page.fill("input[name=operator]", operator)
    await page.fill("input[name=password]", PASSWORDS[operator])
    await page.click("button[type=submit]")
    await expect(page.locator("#operator")).to_have_text(operator)
    return page


async def waiting(client: Client, scenario: dict[str, Any]) -> tuple[str, str]:
    run_id = await client.submit_scenario(parse_scenario(scenario))
    await client.wait(run_id, timeout=bound(30), until=("awaiting_human",))
    items = await escalations_of(client, run_id)
    assert len(items) == 1
    return run_id, items[0].escalation_id


async def test_an_operator_logs_in_claims_provides_the_result_and_the_run_completes(
    human_stack: LocalStack, browser: Browser, human_client: Client, tmp_path: Path
) -> None:
    run_id, esc_id = await waiting(human_client, CORRECTION)
    page = await logged_in(browser, human_stack, "alice")
    row = page.locator(f"tr[data-escalation='{esc_id}']")
    await expect(row).to_contain_text("schema_cap")
    await expect(row).to_contain_text("calculator")
    shot = tmp_path / "queue.png"
    await page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 1000
    print(f"queue screenshot: {shot}")

    await row.locator("a", has_text=esc_id).click()
    await expect(page.locator("#reason")).to_contain_text("failed its contract 3 times")
    await expect(page.locator("#arguments")).to_contain_text('"expr": "1+1"')
    await expect(page.locator("#failure-type")).to_have_text("input_invalid")
    await expect(page.locator("form[id^=form-]")).to_have_count(5)
    await page.click("#claim")
    await expect(page.locator("#flash")).to_have_text("claim: done")
    await expect(page.locator("#item-status")).to_have_text("claimed")
    await expect(page.locator("#item-live")).to_contain_text("alice via console")

    form = page.locator("#form-provide_result")
    await form.locator("textarea[name=result]").fill('{"status": "ok", "expression": "1+1", "result": 2}')
    await form.locator("textarea[name=note]").fill("worked it out by hand")
    await page.click("#do-provide_result")
    await expect(page.locator("#flash")).to_have_text("resolve: done")
    await expect(page.locator("#resolution")).to_contain_text("provide_result by alice via console")

    state = await human_client.wait(run_id, timeout=bound(30))
    assert state.status == "completed" and state.final_output == "1 + 1 = 2"
    await page.goto(f"{human_stack.console_url}/runs/{run_id}")
    await expect(page.locator("#run-status")).to_have_text("completed")
    await expect(page.locator("#timeline")).to_contain_text("provide_result by alice via console")
    await expect(page.locator("#timeline")).to_contain_text("run.completed")
    link = await page.locator("#trace-link").get_attribute("href")
    assert link is not None and link.startswith(f"{JAEGER}/trace/") and len(link.rsplit("/", 1)[1]) == 32
    await page.goto(f"{human_stack.console_url}/runs")
    await expect(page.locator(f"tr[data-run='{run_id}']")).to_contain_text("completed")
    await page.close()


async def test_a_bad_contract_result_is_refused_in_the_page(
    human_stack: LocalStack, browser: Browser, human_client: Client
) -> None:
    run_id, esc_id = await waiting(human_client, CORRECTION)
    page = await logged_in(browser, human_stack, "alice", f"/escalations/{esc_id}")
    form = page.locator("#form-provide_result")
    await form.locator("textarea[name=result]").fill('{"status": "ok", "result": "two"}')
    await page.click("#do-provide_result")
    await expect(page.locator("#flash")).to_contain_text("breaks the output contract of 'calculator'")
    await expect(page.locator("#item-status")).to_have_text("open")
    form = page.locator("#form-final_answer")
    await form.locator("textarea[name=answer]").fill("Two.")
    await page.click("#do-final_answer")
    await expect(page.locator("#flash")).to_have_text("resolve: done")
    state = await human_client.wait(run_id, timeout=bound(30))
    assert state.status == "completed" and state.final_output == "Two."
    await page.close()


async def test_an_operator_without_the_right_is_refused(
    human_stack: LocalStack, browser: Browser, human_client: Client
) -> None:
    page = await browser.new_page()
    await page.goto(f"{human_stack.console_url}/login")
    await page.fill("input[name=operator]", "bob")
    await page.fill("input[name=password]", "not-bobs-password")
    await page.click("button[type=submit]")
    await expect(page.locator("#login-error")).to_have_text("unknown operator or wrong password")
    await page.close()

    run_id, esc_id = await waiting(human_client, CORRECTION)
    page = await logged_in(browser, human_stack, "bob", f"/escalations/{esc_id}")
    await page.click("#claim")
    await expect(page.locator("#flash")).to_contain_text("refused: bob may not act on schema_cap escalations")
    await page.check("#confirm-abort")  # an abort is confirmed on the page
    await page.click("#do-abort")
    await expect(page.locator("#flash")).to_contain_text("refused: bob may not act on schema_cap")
    await expect(page.locator("#item-status")).to_have_text("open")
    await expect(page.locator("#trail")).to_contain_text("refused — bob via console (resolve)")
    state = await human_client.state(run_id)
    assert state is not None and state.status == "awaiting_human"
    refusals = await human_client.events(run_id, subjects=S.ESCALATION_REFUSED, timeout=bound(0.5))
    assert [(e.payload["operator"], e.payload["via"]) for e in refusals] == [("bob", "console")] * 2
    assert (await human_client.resolve(esc_id, "alice", "abort")).ok  # leave the stack tidy
    await page.close()


FATAL = {
    "name": "fatal-console",
    "task": "Read the orders of cus_ada1.",
    "planner": [
        {"text": "Looking at the orders table first.", "tool_calls": [
            {"name": "sql_query", "id": "toolu_orders", "input": {"query": "select * from orders"}}
        ]}
    ],
    "tools": {"sql_query": [{"fail": "fatal", "error": "permission denied for table orders"}]},
}  # fmt: skip


async def test_an_item_filed_from_a_failure_event_shows_the_runs_last_turns(
    human_stack: LocalStack, browser: Browser, human_client: Client
) -> None:
    """A ``fatal`` item, filed by the escalation service from the failure event, stores no turns: its page reads
    the run's last turns from the run's conversation, as for every other kind."""
    run_id, esc_id = await waiting(human_client, FATAL)
    stored, _ = await human_client.bus.kv_get(S.KV_ESCALATIONS, esc_id, Escalation)
    assert stored is not None and stored.kind == "fatal" and stored.context == []
    page = await logged_in(browser, human_stack, "alice", f"/escalations/{esc_id}")
    await expect(page.locator("#failure-type")).to_have_text("fatal")
    turns = page.locator("#last-turns .turn")
    await expect(turns.first).to_contain_text("Read the orders of cus_ada1.")
    await expect(page.locator("#last-turns")).to_contain_text("Looking at the orders table first.")
    await expect(page.locator("#last-turns")).to_contain_text("→ sql_query")
    state = await human_client.state(run_id, history=True)
    assert state is not None and await turns.count() == len(state.messages[-6:])
    assert (await human_client.resolve(esc_id, "alice", "abort", "no access")).ok
    await page.close()


async def test_an_sla_expiry_shows_up_live(human_stack: LocalStack, browser: Browser, human_client: Client) -> None:
    run_id = await human_client.submit_scenario(parse_scenario(LOOP))
    page = await logged_in(browser, human_stack, "alice", f"/queue?status=all&run={run_id}")
    loaded_at = await page.evaluate("window.lwLoadedAt")
    row = page.locator("#queue tr[data-escalation]")
    await expect(row).to_contain_text("open")  # appears live once the run escalates
    await expect(row).to_contain_text("abort at")  # the SLA's deadline and default action
    await expect(row).to_contain_text("abort by SLA", timeout=SLA_S * 1000 + 20_000)
    assert await page.evaluate("window.lwLoadedAt") == loaded_at  # updated in place, never reloaded
    state = await human_client.wait(run_id, timeout=bound(30))
    assert state.status == "stopped" and "the SLA" in (state.final_reason or "")
    applied = await human_client.events(run_id, subjects=S.ESCALATION_SLA_APPLIED, timeout=bound(0.5))
    assert [e.payload["action"] for e in applied] == ["abort"]
    await page.close()


async def test_an_unrenewed_claim_expires_back_to_the_queue(human_client: Client) -> None:
    run_id, esc_id = await waiting(human_client, CORRECTION)
    claimed = await human_client.claim(esc_id, "alice")
    assert claimed.ok and claimed.escalations[0].lease_expires_at is not None
    assert (await human_client.renew(esc_id, "alice")).ok
    for _ in range(int(LEASE_S * 20) + 200):
        item = (await human_client.show(esc_id)).escalations[0]
        if item.status == "open":
            break
        await asyncio.sleep(0.05)
    assert item.status == "open" and item.claimed_by is None
    assert [e.kind for e in item.trail] == ["claimed", "renewed", "expired"]
    expired = await human_client.events(run_id, subjects=S.ESCALATION_EXPIRED, timeout=bound(0.5))
    assert [e.payload["operator"] for e in expired] == ["alice"]
    taken = await human_client.claim(esc_id, "bob")  # back in the queue: bob's roster still forbids schema_cap
    assert not taken.ok and "refused" in (taken.error or "")
    assert (await human_client.claim(esc_id, "alice")).ok
    assert (await human_client.resolve(esc_id, "alice", "abort")).ok
    assert (await human_client.wait(run_id, timeout=bound(60))).status == "stopped"


async def test_an_sla_that_falls_back_resumes_the_run(human_client: Client) -> None:
    run_id, esc_id = await waiting(human_client, CHARGE)
    item = (await human_client.show(esc_id)).escalations[0]
    assert (item.kind, item.sla_action) == ("ask_human", "fall_back")
    state = await human_client.wait(run_id, timeout=SLA_S + 30)
    assert state.status == "completed", state.final_reason
    assert "nobody answered" in (state.final_output or "")
    results = [b.content for m in state.messages for b in m.content if b.type == "tool_result"]
    assert any("no human decided within the SLA: continue without this result" in r for r in results), results
    resolution = (await human_client.show(esc_id)).escalations[0].resolution
    assert resolution is not None and (resolution.action, resolution.by_sla, resolution.resolved_by) == (
        "resume",
        True,
        "sla",
    )


async def test_an_sla_accepts_only_what_was_judged_else_the_model_revises(human_client: Client) -> None:
    run_id, esc_id = await waiting(human_client, UNJUDGED)
    state = await human_client.wait(run_id, timeout=SLA_S + 30)
    # nothing was judged, so the SLA does not accept it: the model revises and the judge passes it
    assert state.status == "completed" and state.passed is True and state.retry_count == 1, state.final_reason
    resolution = (await human_client.show(esc_id)).escalations[0].resolution
    assert resolution is not None and (resolution.action, resolution.by_sla) == ("reject", True)
