"""The console on the locked deployment (issue 35, items 2 and 6: L7, N1): its NATS user reads what a run's page,
export and Replay need, every id a URL carries is matched before it reaches NATS, and a console off NATS for good
says so and exits.

The session's locked deployment runs the console as its own user beside every service, scripted runs off. alice
(every kind) and carol (a console login on no operators' roster) log in; pages are read in headless Chromium and
over plain HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from loopwarden.client import Client
from loopwarden.fake_model import FakeModel
from shared.messages import Rubric, RunSubmit
from tests.support.console import CHROMIUM, CHROMIUM_FLAGS, request, session_cookie
from tests.support.console import login as http_login
from tests.support.locked import CONSOLE_PASSWORDS, Deployment
from tests.support.model_turns import sql_task
from tests.support.timing import bound, polls

pytestmark = pytest.mark.skipif(
    not shutil.which(CHROMIUM) and not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} missing"
)


def judged_task(model: FakeModel) -> str:
    """A live task: one calculator call, an answer, and the judge's full marks (the judge's request carries the
    task, so the script answers it too)."""
    key = f"judged{uuid.uuid4().hex[:10]}"
    call = {"type": "tool_use", "id": "toolu_1", "name": "calculator", "input": {"expression": "6*7"}}
    scores = {"scores": {"correct": 1.0}, "reasons": {"correct": "42 is 6*7"}}
    model.script(
        key,
        [
            {"content": [call]},
            {"content": [{"type": "text", "text": "the answer is 42"}]},
            {"content": [{"type": "text", "text": json.dumps(scores)}]},
        ],
    )
    return f"What is 6*7? [script:{key}]"


@pytest.fixture(scope="module")
def judged(locked: Deployment, messages_api: FakeModel) -> str:
    """A judged run of tenant acme, submitted by its own client."""

    async def submit() -> str:
        async with Client(locked.settings("client_acme")) as acme:
            run_id = f"run-judged{uuid.uuid4().hex[:10]}"
            rubric = Rubric.model_validate({"threshold": 0.5, "criteria": [{"name": "correct"}]})
            await acme.submit(RunSubmit(run_id=run_id, task=judged_task(messages_api), rubric=rubric))
            state = await acme.wait(run_id, timeout=bound(60))
            assert state.status == "completed" and state.passed, (state.status, state.final_reason)
            return run_id

    return asyncio.run(submit())


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield b
        await b.close()


async def logged_in(browser: Browser, locked: Deployment, path: str, operator: str = "alice") -> Page:
    page = await (await browser.new_context(viewport={"width": 1280, "height": 900})).new_page()
    page.set_default_timeout(bound(15) * 1000)
    await page.goto(f"{locked.console}{path}")
    await page.fill("input[name=operator]", operator)
    await page.fill("input[name=password]", CONSOLE_PASSWORDS[operator])
    await page.click("button[type=submit]")
    await expect(page.locator("#operator")).to_have_text(operator)
    return page


async def open_step(page: Page, step_id: str) -> Any:
    step = page.locator(f"details.step[data-step='{step_id}']")
    await step.locator(":scope > summary").click()
    await expect(step).to_have_attribute("open", "")
    return step.locator(":scope > .step-body")


# --- L7: the run page, its export and Replay, as the console's own user --------------------------------------


async def test_the_run_page_shows_model_calls_tool_outputs_and_verdicts(
    locked: Deployment, judged: str, browser: Browser
) -> None:
    page = await logged_in(browser, locked, f"/runs/{judged}")
    await expect(page.locator("#run-view")).to_contain_text("calculator")
    assert "not readable here" not in await page.content()
    await open_step(page, "i1")
    tool = await open_step(page, "i1.tool.toolu_1")
    await expect(tool.locator("[data-section='raw-output']")).to_contain_text('"result": 42')
    await expect(tool).to_contain_text("Raw output (before validation, ")
    turn = await open_step(page, "i1.model")
    await expect(turn).to_contain_text("calculator")
    await open_step(page, "i2")
    judge = await open_step(page, "i2.judge")
    await expect(judge.locator("tr[data-criterion='correct']")).to_contain_text("42 is 6*7")
    await page.close()


async def test_the_export_is_the_whole_record(locked: Deployment, judged: str) -> None:
    cookie = session_cookie(http_login(locked.console, "alice", CONSOLE_PASSWORDS["alice"], "127.0.0.21"))
    got = request(locked.console, "GET", f"/runs/{judged}/export", headers={"Cookie": cookie}, source="127.0.0.21")
    assert got.status == 200, got.body[:500]
    record = json.loads(got.body)
    assert record["config"]["tenant"] == "acme" and len(record["config"]) > 10
    assert len(record["model_calls"]) == 2 and record["tool_calls"][0]["raw_output"]["result"] == 42
    assert [v["status"] for v in record["verdicts"]] == ["passed"]


async def test_replay_works_with_scripted_runs_off_and_is_charged_to_the_runs_tenant(
    locked: Deployment, judged: str, browser: Browser
) -> None:
    page = await logged_in(browser, locked, f"/runs/{judged}")
    await page.click("#replay-button")
    await expect(page.locator("#replay-verdict")).to_contain_text("Matched", timeout=bound(60) * 1000)
    replay_id = await page.locator("#replay-run").inner_text()
    await page.close()
    async with Client(locked.settings("alice")) as alice:
        state = await alice.state(replay_id)
        assert state is not None and (state.status, state.tenant) == ("completed", "acme")
    async with Client(locked.settings("client_acme")) as acme:  # the tenant sees its replay among its runs
        assert replay_id in [r.run_id for r in await acme.runs(limit=None)]


async def test_a_console_login_off_the_roster_may_not_replay(locked: Deployment, judged: str, browser: Browser) -> None:
    page = await logged_in(browser, locked, f"/runs/{judged}", operator="carol")
    await page.click("#replay-button")
    await expect(page.locator("#replay-error")).to_contain_text("carol is not on the operators' roster")
    await page.close()


async def test_the_queue_shows_each_items_tenant(locked: Deployment, messages_api: FakeModel, browser: Browser) -> None:

    done = locked.cli("client_acme", "submit", "--task", sql_task(messages_api), "--wait", "--timeout", "60")
    assert done.returncode == 5, done.stdout + done.stderr
    run_id = done.stdout.splitlines()[0]
    page = await logged_in(browser, locked, f"/queue?run={run_id}")
    row = page.locator("tr[data-escalation]")
    await expect(row).to_have_count(1)
    await expect(row.locator("td.tenant")).to_have_text("acme")
    await row.locator("a").first.click()
    await expect(page.locator("#item-tenant")).to_have_text("acme")
    await page.close()


# --- N1: an over-long id in a URL --------------------------------------------------------------------------------


async def test_an_over_long_id_in_a_url_is_not_found_and_the_console_stays_on_nats(
    locked: Deployment, judged: str
) -> None:
    """Review 4's P6-L01/L03/L05 as carol (on no roster): each over-long URL is a 404, and every operator's
    pages keep working (on the code before, the first one closed the console's connection for good)."""
    carol = session_cookie(http_login(locked.console, "carol", CONSOLE_PASSWORDS["carol"], "127.0.0.22"))
    long = "a" * 5000
    for path in (f"/runs/{long}", f"/runs/{long}/export", f"/runs/{long}/steps/x", f"/escalations/{long}"):
        got = request(locked.console, "GET", path, headers={"Cookie": carol}, source="127.0.0.22")
        assert got.status == 404, (path[:40], got.status, got.body[:200])
    alice = session_cookie(http_login(locked.console, "alice", CONSOLE_PASSWORDS["alice"], "127.0.0.23"))
    for path in ("/queue", f"/runs/{judged}"):
        got = request(locked.console, "GET", path, headers={"Cookie": alice}, source="127.0.0.23")
        assert got.status == 200, (path, got.status, got.body[:200])
    assert request(locked.console, "GET", "/healthz").status == 200
    assert "closed for good" not in locked.logs()


# --- a console off NATS for good ---------------------------------------------------------------------------------


def test_a_console_whose_connection_is_closed_for_good_says_so_and_exits_non_zero(tmp_path: Path) -> None:
    """nats-server closes a connection whose control line passes its limit, and nats-py does not reconnect: the
    limit is lowered under the running console (a config reload), its next long publish is refused so, and the
    console must not stay up and off NATS: /healthz answers 503 and the process exits non-zero."""
    from loopwarden.stack import LocalStack
    from tests.support import locked as L
    from tests.support.stacks import TEST_ENV

    with L.locked_server(tmp_path, "closed-console") as url:
        console_env = {
            **L.creds("console"),
            "LW_CONSOLE_USERS": L.console_users(),
            "LW_CONSOLE_SECRET": L.CONSOLE_SECRET,
            "LW_CONSOLE_PORT": "0",
        }
        stack = LocalStack(state_dir=tmp_path, nats_url=url, env=TEST_ENV, services=("console",))
        stack.env_per_service = {"console": console_env}
        asyncio.run(L.bootstrap_as_admin(url))
        try:
            stack.start()
            (proc,) = stack.procs
            console = stack.console_url
            assert console is not None
            cookie = session_cookie(http_login(console, "alice", CONSOLE_PASSWORDS["alice"], "127.0.0.24"))
            conf = tmp_path / "server.conf"
            conf.write_text(conf.read_text().replace("server_name:", "max_control_line: 64\nserver_name:", 1))
            found = subprocess.run(["pgrep", "-f", "--", f"-c {conf}"], capture_output=True, text=True).stdout.split()
            (pid,) = (int(p) for p in found)
            subprocess.run(["kill", "-HUP", str(pid)], check=True)
            time.sleep(bound(1))
            with contextlib.suppress(OSError):  # it may be gone already: its own live view publishes too
                request(
                    console, "GET", "/runs/run-aaaaaaaaaaaaaaaaaaaa", headers={"Cookie": cookie}, source="127.0.0.24"
                )
            health = []
            for _ in range(polls(100)):
                if proc.popen.poll() is not None:
                    break
                try:
                    health.append(request(console, "GET", "/healthz", timeout=bound(2)).status)
                except OSError:
                    pass
                time.sleep(0.05)
            assert proc.popen.wait(timeout=bound(20)) != 0
            log = proc.log.read_text(errors="replace")
            assert "closed for good" in log and "exiting to be restarted" in log, log[-2000:]
            assert 200 not in health[-1:], health  # never "ok" once it is off NATS for good
        finally:
            stack.stop()


async def test_healthz_answers_503_once_the_connection_is_closed_for_good() -> None:
    from loopwarden.console.app import create_app
    from shared.settings import Settings

    client = Client(Settings(nats_url="nats://127.0.0.1:1", console_secret="s"), identity="console")
    _, console = create_app(client.settings, client)
    assert (await console.healthz(None)).status_code == 200  # type: ignore[arg-type]
    client.bus.closed_for_good.set()
    answer = await console.healthz(None)  # type: ignore[arg-type]
    assert answer.status_code == 503 and b"closed for good" in answer.body


def test_every_path_id_is_matched_before_use() -> None:
    from loopwarden.console.guard import bad_path_id

    assert bad_path_id({"run_id": "run-abc", "step_id": "i1.tool.toolu_1"}) is None
    assert bad_path_id({"run_id": "a" * 65}) == "run_id"
    assert bad_path_id({"escalation_id": "esc.1"}) == "escalation_id"
    assert bad_path_id({"replay_id": "../x"}) == "replay_id"
    assert bad_path_id({"anything": "x"}) == "anything"  # a parameter with no pattern is never let through


async def test_an_item_whose_tool_has_no_contract_offers_no_provided_result(locked: Deployment) -> None:
    from shared import subjects as S
    from shared.messages import EscalationRaise

    esc_id = f"esc-nocontract-{uuid.uuid4().hex[:8]}"
    item = EscalationRaise(
        escalation_id=esc_id, run_id=f"run-{esc_id}", kind="fatal", reason="gone for good", tool="no_such_tool"
    )
    async with Client(locked.settings("admin")) as admin:
        await admin.bus.publish(S.ESCALATION_RAISE, item, msg_id=f"raise.{esc_id}")
        for _ in range(polls(100)):
            if (await admin.show(esc_id)).ok:
                break
            await asyncio.sleep(0.05)
    alice = session_cookie(http_login(locked.console, "alice", CONSOLE_PASSWORDS["alice"], "127.0.0.25"))
    page = request(locked.console, "GET", f"/escalations/{esc_id}", headers={"Cookie": alice}, source="127.0.0.25")
    assert page.status == 200, page.body[:300]
    assert 'id="form-abort"' in page.body and 'id="form-provide_result"' not in page.body
    assert "provide result is not offered: no output contract is registered for &#39;no_such_tool&#39;" in page.body
    shown = locked.cli("alice", "escalations", "show", esc_id)
    assert "(provide_result is not offered: no output contract is registered for 'no_such_tool')" in shown.stdout
