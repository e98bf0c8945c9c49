"""The run page as a debugger, and the runs list, in a real browser (issue 26).

A private stack — nats-server, every service and the console — runs the shipped scenarios; Playwright
drives Debian's chromium-headless-shell. Each view is checked for what an operator needs to see (the raw
output of a broken call, its error paths and the correction; each criterion's score; a waiting run
resolved and turning completed live), for speed (the runs list filtered with 10,000 runs stored), and by
axe-core for accessibility. The screenshots land in ``docs/img`` (``LW_DOCS_SCREENSHOTS=1``) or a temp dir.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from axe_playwright_python.async_playwright import Axe
from playwright.async_api import Browser, Page, async_playwright, expect

from loopwarden.client import Client
from loopwarden.console.auth import hash_password
from loopwarden.stack import LocalStack
from shared import subjects as S
from shared.scenario import parse_scenario
from shared.settings import Settings
from tests.support.otlp_collector import OtlpCollector
from tests.support.paths import ROOT
from tests.support.runs import escalations_of
from tests.support.stacks import TEST_ENV, running
from tests.support.timing import bound

CHROMIUM = "/usr/bin/chromium-headless-shell"
FLAGS = ["--no-sandbox", "--disable-background-networking", "--disable-component-update", "--no-first-run"]
PASSWORD = "alice-pw-7"
JAEGER = "http://jaeger.invalid:16686"
SHOTS = ROOT / "docs" / "img" if os.environ.get("LW_DOCS_SCREENSHOTS") else None
STORED_RUNS = 10_000
FAILED_EVERY = 7  # one stored run in seven failed


def scenario(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "scenarios" / f"{name}.yaml").read_text())
    return data


pytestmark = pytest.mark.skipif(
    not shutil.which(CHROMIUM) and not os.path.exists(CHROMIUM),
    reason=f"{CHROMIUM} missing: `make test` installs it (apt-get install -y chromium-headless-shell)",
)


@pytest.fixture(scope="module")
def runview_stack(tmp_path_factory: pytest.TempPathFactory, otlp: OtlpCollector) -> Iterator[LocalStack]:
    env = {
        **TEST_ENV,
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint,
        "LW_OPERATORS": json.dumps({"alice": ["*"]}),
        # carol may log in to the console but is on no operators' roster: she may not start a replay
        "LW_CONSOLE_USERS": json.dumps(
            {"alice": hash_password(PASSWORD, rounds=4), "carol": hash_password(PASSWORD, rounds=4)}
        ),
        "LW_CONSOLE_PORT": "0",
        "LW_JAEGER_URL": JAEGER,
    }
    yield from running(
        LocalStack(
            state_dir=tmp_path_factory.mktemp("runview"),
            env=env,
            services=("planner", "executor", "validator", "judge", "governor", "escalation", "console"),
        )
    )


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield b
        await b.close()


@pytest.fixture
async def runview_client(runview_stack: LocalStack) -> AsyncIterator[Client]:
    async with Client(Settings(nats_url=runview_stack.nats_url)) as c:
        yield c


async def logged_in(browser: Browser, stack: LocalStack, path: str, operator: str = "alice") -> Page:
    context = await browser.new_context(viewport={"width": 1280, "height": 900})  # a second tab shares the login
    page = await context.new_page()
    page.set_default_timeout(15_000)
    await page.goto(f"{stack.console_url}{path}")
    await page.fill("input[name=operator]", operator)
    await page.fill("input[name=password]", PASSWORD)
    await page.click("button[type=submit]")
    await expect(page.locator("#operator")).to_have_text(operator)
    return page


async def finished(client: Client, name: str) -> str:
    run_id = await client.submit_scenario(parse_scenario(scenario(name)))
    state = await client.wait(run_id, timeout=bound(60))
    assert state.status == "completed", state.final_reason
    return run_id


async def no_serious_violations(page: Page) -> None:
    results = await Axe().run(page)
    serious = [v for v in results.response["violations"] if v.get("impact") in ("serious", "critical")]
    assert serious == [], json.dumps([(v["id"], v["help"], [n["target"] for n in v["nodes"]]) for v in serious])


async def shot(page: Page, name: str, tmp_path: Path) -> None:
    path = (SHOTS or tmp_path) / name
    await page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 1000


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def step(page: Page, step_id: str) -> Any:
    return page.locator(f"details.step[data-step='{step_id}']")


async def open_step(page: Page, step_id: str) -> Any:
    """Opens a step from the keyboard (focus its row, Enter), as an operator without a mouse would."""
    summary = step(page, step_id).locator(":scope > summary")
    await summary.focus()
    await page.keyboard.press("Enter")
    await expect(step(page, step_id)).to_have_attribute("open", "")
    return step(page, step_id).locator(":scope > .step-body")


async def test_a_broken_output_shows_its_raw_output_error_paths_and_the_correction(
    runview_stack: LocalStack, browser: Browser, runview_client: Client, tmp_path: Path
) -> None:
    run_id = await finished(runview_client, "malformed-output-corrected")
    page = await logged_in(browser, runview_stack, f"/runs/{run_id}")
    await expect(page.locator("#run-status")).to_have_text("completed")
    await expect(page.locator("#run-decide")).to_contain_text("row 5: complete")
    await expect(page.locator("#run-end")).to_contain_text("terminal tool ran in this iteration")
    await expect(page.locator("#run-failures")).to_contain_text("i1.tool.toolu_001_01")
    call = step(page, "i1.tool.toolu_001_01")
    await expect(call).to_have_attribute("data-status", "failed")
    await expect(step(page, "i1")).to_have_attribute("open", "")  # the failed iteration opens by itself
    assert '"score": 0.7' not in await page.content()  # a step's body is not on the page until it is opened

    body = await open_step(page, "i1.tool.toolu_001_01")
    await expect(body.locator("[data-section='raw-output']")).to_contain_text('"score": 0.7')
    errors = body.locator("[data-section='errors'] tbody tr")
    await expect(errors).to_have_count(2)
    await expect(errors.first).to_contain_text("$.results[0]")
    await expect(errors.first).to_contain_text("missing required field 'url'")
    await expect(body.locator("[data-section='seen']")).to_contain_text("breaks its output contract")
    await expect(body.locator("[data-section='correction']")).to_contain_text("the model corrected a schema failure")
    await expect(step(page, "i2.tool.toolu_002_01")).to_have_attribute("data-status", "ok")

    turn = await open_step(page, "i1.model")
    await expect(turn.locator("[data-section='response']")).to_contain_text('"stop reason": "tool_use"')
    await expect(turn.locator("[data-section='sent']")).to_contain_text("read (cached) tokens")
    link = await page.locator("#trace-link").get_attribute("href")
    assert link is not None and link.startswith(f"{JAEGER}/trace/") and len(link.rsplit("/", 1)[1]) == 32
    await shot(page, "run-broken-output.png", tmp_path)
    await no_serious_violations(page)
    async with page.expect_download() as download:
        await page.click("#export-link")
    exported = read_json(await (await download.value).path())
    assert exported["run_id"] == run_id and exported["format"] == "loopwarden.run-record"
    await page.close()


async def test_a_judged_run_shows_each_criterions_score(
    runview_stack: LocalStack, browser: Browser, runview_client: Client, tmp_path: Path
) -> None:
    run_id = await finished(runview_client, "demo")
    page = await logged_in(browser, runview_stack, f"/runs/{run_id}")
    judge = step(page, "i3.judge")
    await open_step(page, "i3")
    await expect(judge).to_contain_text("accuracy 0.95")
    body = await open_step(page, "i3.judge")
    rows = body.locator("[data-section='criteria'] tbody tr")
    await expect(rows).to_have_count(3)
    await expect(body.locator("tr[data-criterion='accuracy']")).to_contain_text("0.95")
    await expect(body.locator("tr[data-criterion='accuracy']")).to_contain_text("soft")
    await expect(body.locator("tr[data-criterion='accuracy']")).to_contain_text("120 s matches the 2-minute default")
    await expect(body.locator("tr[data-criterion='cites a source']")).to_contain_text("hard")
    await expect(body.locator("[data-section='verdict']")).to_contain_text('"threshold": 0.8')
    retried = step(page, "i1.tool.toolu_001_01")  # the search backend's 503, retried, then repaired
    await expect(retried).to_have_attribute("data-status", "repaired")
    await expect(step(page, "i1.tool.toolu_001_01.a1")).to_have_attribute("data-status", "retried")
    await shot(page, "run-judged.png", tmp_path)
    await no_serious_violations(page)
    await page.close()


async def test_a_run_waiting_for_a_human_is_resolved_from_the_page_and_turns_completed_live(
    runview_stack: LocalStack, browser: Browser, runview_client: Client, tmp_path: Path
) -> None:
    run_id = await runview_client.submit_scenario(parse_scenario(scenario("correction-escalates")))
    await runview_client.wait(run_id, timeout=bound(30), until=("awaiting_human",))
    (item,) = await escalations_of(runview_client, run_id)
    page = await logged_in(browser, runview_stack, f"/runs/{run_id}")
    loaded_at = await page.evaluate("window.lwLoadedAt")
    await expect(page.locator("#run-status")).to_have_text("awaiting_human")
    await expect(page.locator("#run-end")).to_have_text("Waiting for a person")
    esc = step(page, f"esc.{item.escalation_id}")
    await expect(esc).to_have_attribute("data-status", "waiting")
    body = await open_step(page, f"esc.{item.escalation_id}")
    await expect(body.locator("[data-section='resolution']")).to_contain_text("waiting for a person")
    await shot(page, "run-waiting.png", tmp_path)

    # the operator resolves it from the page (the escalation's link), in a second tab, as one would
    other = await page.context.new_page()
    await other.goto(f"{runview_stack.console_url}/runs/{run_id}")
    await other.click(f"#run-escalations a:has-text('{item.escalation_id}')")
    form = other.locator("#form-provide_result")
    await form.locator("textarea[name=result]").fill('{"status": "ok", "expression": "1+1", "result": 2}')
    await form.locator("textarea[name=note]").fill("worked it out by hand")
    await other.click("#do-provide_result")
    await expect(other.locator("#flash")).to_have_text("resolve: done")

    # the first tab, never reloaded, follows the run to its end; the open step stays open, refreshed
    await expect(page.locator("#run-status")).to_have_text("completed", timeout=bound(30_000))
    await expect(page.locator("#run-decide")).to_contain_text("complete")
    await expect(esc).to_have_attribute("open", "")
    await expect(esc.locator(":scope > summary")).to_contain_text("provide_result by alice via console")
    resolution = esc.locator(":scope > .step-body [data-section='resolution']")
    await expect(resolution).to_contain_text('"who": "alice"')
    await expect(resolution).to_contain_text('"provided": {')
    await expect(resolution).to_contain_text("worked it out by hand")
    await expect(page.locator("#run-escalations")).to_contain_text("resolved (provide_result by alice)")
    assert await page.evaluate("window.lwLoadedAt") == loaded_at
    assert await page.evaluate("window.lwRunUpdates") >= 1
    await shot(page, "run-resolved-live.png", tmp_path)
    await no_serious_violations(page)
    await page.context.close()


async def test_a_model_turn_shows_the_system_prompt_tools_and_cache_it_was_sent(
    runview_stack: LocalStack, browser: Browser, runview_client: Client, tmp_path: Path
) -> None:
    run_id = await finished(runview_client, "demo")
    turns = [e for e in await runview_client.events(run_id) if e.kind == "run.model_called"]
    assert len(turns) == 3
    details = [t.payload["detail"] for t in turns]
    # stored once per run: the first turn carries the text, its hash and the tools offered; a later turn sent the
    # same names neither (the run view reads the last turn that names them)
    assert details[0]["system"].startswith("You are an agent that completes the user's task")
    assert details[0]["system_sha256"] and details[0]["tools_offered"]
    assert [(d.get("system"), d.get("system_sha256"), d.get("tools_offered")) for d in details[1:]] == [(None,) * 3] * 2
    page = await logged_in(browser, runview_stack, f"/runs/{run_id}")
    assert "You are an agent that completes" not in await page.content()  # fetched when the step is opened
    await open_step(page, "i3")
    turn = await open_step(page, "i3.model")  # a later turn: the text found by its hash
    await expect(turn.locator("[data-section='system']")).to_contain_text(
        "You are an agent that completes the user's task with the tools provided."
    )
    sent = turn.locator("[data-section='sent']")
    await expect(sent).to_contain_text('"tools offered": [')
    await expect(sent).to_contain_text('"search"')
    await expect(sent).to_contain_text("read (cached) tokens")
    await expect(turn.locator("[data-section='conversation']")).to_contain_text("Conversation carried")
    await shot(page, "run-model-turn.png", tmp_path)
    await no_serious_violations(page)
    await page.context.close()


async def test_a_completed_run_is_replayed_from_its_page_and_matches_call_for_call(
    runview_stack: LocalStack, browser: Browser, runview_client: Client, tmp_path: Path
) -> None:
    run_id = await finished(runview_client, "malformed-output-corrected")
    page = await logged_in(browser, runview_stack, f"/runs/{run_id}")
    await expect(page.locator("#export-link")).to_have_attribute("href", f"/runs/{run_id}/export")
    await expect(page.locator("#replay-live-tools")).not_to_be_checked()  # a dry run unless chosen
    await page.click("#replay-button")
    await expect(page.locator("#replay-verdict")).to_contain_text("Matched", timeout=bound(60) * 1000)
    replay_id = await page.locator("#replay-run").inner_text()
    assert replay_id != run_id
    await expect(page.locator("#replay-status")).to_contain_text("completed (recorded: completed)")
    rows = page.locator("#replay-compare tbody tr")
    assert await rows.count() >= 3
    await expect(page.locator("#replay-compare tbody tr[data-same='no']")).to_have_count(0)
    await expect(rows.first).to_contain_text("validation")
    assert (await runview_client.state(replay_id)).status == "completed"  # type: ignore[union-attr]
    await shot(page, "run-replayed.png", tmp_path)
    await no_serious_violations(page)
    await page.click("#replay-run")
    await expect(page.locator("h1")).to_have_text(f"Run {replay_id}")
    await expect(page.locator("#run-status")).to_have_text("completed")

    # the form is the console's own: a post without the session's token is refused, and starts nothing
    answer = await page.request.post(
        f"{runview_stack.console_url}/runs/{run_id}/replay",
        form={"csrf": "stale"},
        headers={"Origin": str(runview_stack.console_url)},
        max_redirects=0,
    )
    assert answer.status == 403 and "stale" in await answer.text()
    await page.context.close()


async def test_a_replay_of_a_run_a_person_resolved_stops_where_the_person_was_and_says_so(
    runview_stack: LocalStack, browser: Browser, runview_client: Client
) -> None:
    run_id = await runview_client.submit_scenario(parse_scenario(scenario("correction-escalates")))
    await runview_client.wait(run_id, timeout=bound(30), until=("awaiting_human",))
    (item,) = await escalations_of(runview_client, run_id)
    result = {"status": "ok", "expression": "1+1", "result": 2}
    assert (await runview_client.resolve(item.escalation_id, "alice", "provide_result", "by hand", result)).ok
    assert (await runview_client.wait(run_id, timeout=bound(30))).status == "completed"
    page = await logged_in(browser, runview_stack, f"/runs/{run_id}")
    await page.click("#replay-button")
    await expect(page.locator("#replay-human")).to_contain_text(
        "The replay waits for a person", timeout=bound(60) * 1000
    )
    await expect(page.locator("#replay-status")).to_contain_text("awaiting_human (recorded: completed)")
    await expect(page.locator("#replay-verdict")).to_contain_text("Diverges")
    await page.context.close()


async def test_a_replay_that_would_run_real_tools_or_by_someone_off_the_roster_is_refused(
    runview_stack: LocalStack, browser: Browser, runview_client: Client
) -> None:
    run_id = await finished(runview_client, "malformed-output-corrected")
    carol = await logged_in(browser, runview_stack, f"/runs/{run_id}", operator="carol")
    await carol.click("#replay-button")
    await expect(carol.locator("#replay-error")).to_contain_text("carol is not on the operators' roster")
    await expect(carol.locator("#replay")).to_have_count(0)
    await carol.context.close()

    # a call whose output is no longer recorded would run the real tool: refused unless ticked
    ledger = await runview_client.bus.kv(S.KV_TOOL_LEDGER)
    keys = [k for k in await runview_client.bus.keys(S.KV_TOOL_LEDGER) if k.startswith(f"{run_id}.")]
    assert keys
    for key in keys:
        await ledger.delete(key)
    before = set(await run_ids(runview_client))
    page = await logged_in(browser, runview_stack, f"/runs/{run_id}")
    await page.click("#replay-button")
    error = page.locator("#replay-error")
    await expect(error).to_contain_text(
        re.compile(r"a replay is a dry run, but \d+ call\(s\) of this run have no recorded output")
    )
    await expect(error).to_contain_text("search (call toolu_001_01): succeeded, output not recorded")
    await expect(error).to_contain_text("tick 'run the real tools'")
    assert set(await run_ids(runview_client)) == before  # nothing was submitted
    await no_serious_violations(page)
    await page.context.close()


async def run_ids(client: Client) -> list[str]:
    return await client.bus.keys(S.KV_RUNS)


async def test_the_queue_item_offers_what_fits_its_state_and_confirms_an_abort(
    runview_stack: LocalStack, browser: Browser, runview_client: Client, tmp_path: Path
) -> None:
    run_id = await runview_client.submit_scenario(parse_scenario(scenario("correction-escalates")))
    await runview_client.wait(run_id, timeout=bound(30), until=("awaiting_human",))
    (item,) = await escalations_of(runview_client, run_id)
    page = await logged_in(browser, runview_stack, f"/escalations/{item.escalation_id}")
    await expect(page.locator("#controls-note")).to_contain_text("resolve it now (no claim needed)")
    await expect(page.locator("#claim")).to_be_visible()
    await expect(page.locator("#renew")).to_have_count(0)
    await expect(page.locator("#sla-action")).to_have_text("abort")  # the SLA's default action, counting down
    await expect(page.locator("#sla-countdown")).to_have_text(re.compile(r"^in \d+ m \d\d s$"))
    # the provide-result box: the tool's output schema beside it, and an example of that shape in it
    await expect(page.locator("#output-schema")).to_contain_text('"expression"')
    example = json.loads(await page.locator("#form-provide_result textarea[name=result]").input_value())
    assert set(example) >= {"status", "expression", "result"}, example
    await no_serious_violations(page)

    await page.click("#claim")
    await expect(page.locator("#flash")).to_have_text("claim: done")
    await expect(page.locator("#controls-note")).to_contain_text("you hold this item")
    await expect(page.locator("#claim")).to_have_count(0)  # no Claim on an item one holds
    await expect(page.locator("#renew")).to_be_visible()
    await shot(page, "queue-item.png", tmp_path)

    # an abort is confirmed: without the tick the browser does not send it, and the console refuses it
    await page.click("#do-abort")
    await expect(page.locator("#item-status")).to_have_text("claimed")
    await page.evaluate("document.querySelector('#confirm-abort').removeAttribute('required')")
    await page.click("#do-abort")
    await expect(page.locator("#flash")).to_contain_text("abort: tick 'stop the run' to confirm")
    await page.check("#confirm-abort")
    await page.click("#do-abort")
    await expect(page.locator("#flash")).to_have_text("resolve: done")
    assert (await runview_client.wait(run_id, timeout=bound(30))).status == "stopped"
    # resolved: read-only
    await expect(page.locator("#controls-note")).to_have_text("resolved: this item is read-only")
    await page.reload()
    await expect(page.locator("form[id^=form-]")).to_have_count(0)
    await expect(page.locator("#claim, #renew")).to_have_count(0)
    await page.context.close()


def lw(stack: LocalStack, *args: str) -> subprocess.CompletedProcess[str]:
    """The real ``loopwarden`` CLI against the stack."""
    drop = ("NATS_URL", "LW_NATS_URL", "LW_STATE_DIR", "PYTHONIOENCODING")
    env = {**{k: v for k, v in os.environ.items() if k not in drop}, "LW_NATS_URL": str(stack.nats_url)}
    return subprocess.run(
        [sys.executable, "-m", "loopwarden.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=bound(60),
    )


async def test_the_terminal_prints_the_same_steps_and_a_step_whole(
    runview_stack: LocalStack, runview_client: Client
) -> None:
    run_id = await finished(runview_client, "malformed-output-corrected")
    shown = await asyncio.to_thread(lw, runview_stack, "show", run_id)
    assert shown.returncode == 0, shown.stderr
    assert "decide:   row 5: complete — terminal tool ran in this iteration" in shown.stdout
    assert "failed:   i1.tool.toolu_001_01, i1.tool.toolu_001_01.validation" in shown.stdout
    assert "2 output error(s) at $, $.results[0]  [i1.tool.toolu_001_01.validation]" in shown.stdout
    one = await asyncio.to_thread(lw, runview_stack, "show", run_id, "--step", "i1.tool.toolu_001_01")
    assert one.returncode == 0, one.stderr
    assert '"score": 0.7' in one.stdout and "── Validation errors ──" in one.stdout
    assert '"path": "$.results[0]"' in one.stdout
    whole = await asyncio.to_thread(lw, runview_stack, "show", run_id, "--step", "1")  # an iteration: each of its steps
    printed = re.findall(r"^step:     (\S+)", whole.stdout, re.M)
    assert printed == [
        "i1.model",
        "i1.tool.toolu_001_01",
        "i1.tool.toolu_001_01.a1",
        "i1.tool.toolu_001_01.validation",
        "i1.decide",
    ], whole.stdout
    full = await asyncio.to_thread(lw, runview_stack, "events", run_id, "--full")
    assert full.returncode == 0 and '"score": 0.7' in full.stdout and "step:     i3.decide" in full.stdout
    missing = await asyncio.to_thread(lw, runview_stack, "show", run_id, "--step", "9")
    assert missing.returncode != 0 and "has no step '9' (iterations: i1, i2, i3, end)" in missing.stderr

    waiting = await runview_client.submit_scenario(parse_scenario(scenario("correction-escalates")))
    await runview_client.wait(waiting, timeout=bound(30), until=("awaiting_human",))
    (item,) = await escalations_of(runview_client, waiting)
    text = await asyncio.to_thread(lw, runview_stack, "escalations", "show", item.escalation_id)
    assert text.returncode == 0, text.stderr
    assert f"escalation: {item.escalation_id}" in text.stdout and "kind:       schema_cap" in text.stdout
    assert "── What went wrong ──" in text.stdout and "allowed:    provide_result" in text.stdout
    assert not text.stdout.lstrip().startswith("{")  # text, as the console shows it; JSON only with --json
    as_json = await asyncio.to_thread(lw, runview_stack, "escalations", "show", item.escalation_id, "--json")
    assert json.loads(as_json.stdout)["escalation_id"] == item.escalation_id
    assert (await runview_client.resolve(item.escalation_id, "alice", "abort")).ok


async def store_runs(client: Client, count: int) -> list[str]:
    """``count`` finished runs written straight into ``lw_runs`` (as the planner writes them), oldest
    first; every ``FAILED_EVERY``-th failed. Returns the failed ones' ids."""
    kv = await client.bus.kv(S.KV_RUNS)
    now = datetime.now(UTC)
    failed: list[str] = []

    async def put(i: int) -> None:
        run_id = f"run-bulk{i:06d}"
        status = "failed" if i % FAILED_EVERY == 0 else "completed"
        if status == "failed":
            failed.append(run_id)
        at = (now - timedelta(seconds=count - i)).isoformat().replace("+00:00", "Z")
        record = {
            "run_id": run_id,
            "task": f"stored run number {i}",
            "status": status,
            "created_at": at,
            "updated_at": at,
            "iteration": {"n": 2},
            "usage": {"input_tokens": 1000 + i, "output_tokens": 50, "cost_usd": 0.001 * (i % 10)},
            "final_reason": "the tool kept failing" if status == "failed" else "done",
            "config": {"tenant": f"t{i % 3}"},
            "tool_history": [["search", "x"]],
        }
        await kv.put(run_id, json.dumps(record).encode())

    for start in range(0, count, 500):
        await asyncio.gather(*(put(i) for i in range(start, min(count, start + 500))))
    return failed


async def test_the_runs_list_filters_to_failed_runs_in_under_a_second_with_ten_thousand_stored(
    runview_stack: LocalStack, browser: Browser, runview_client: Client, tmp_path: Path
) -> None:
    failed = await store_runs(runview_client, STORED_RUNS)
    page = await logged_in(browser, runview_stack, "/runs?q=bulk")
    count = page.locator("#run-count")
    for _ in range(60):  # the console has them all once its watcher has caught up
        if f"· {STORED_RUNS} run(s)" in await count.inner_text():
            break
        await page.reload()
    await expect(count).to_contain_text(f"· {STORED_RUNS} run(s) match")
    await page.select_option("select[name=status]", "failed")
    started = time.perf_counter()
    await page.click("#filter-runs")
    await expect(count).to_have_text(f"page 1 of {-(-len(failed) // 50)} · {len(failed)} run(s) match")
    took = time.perf_counter() - started
    print(f"runs list: {len(failed)} failed of {STORED_RUNS} stored, filtered in {took * 1000:.0f} ms")
    assert took < bound(1.0), f"filtering {STORED_RUNS} runs took {took:.2f} s"
    rows = page.locator("#runs tr[data-run]")
    await expect(rows).to_have_count(50)
    await expect(rows.first).to_have_attribute("data-run", failed[-1])  # newest first
    for status in await page.locator("#runs tr[data-run] td:nth-child(2)").all_inner_texts():
        assert status == "failed"
    await page.click("#next-page")
    await expect(count).to_contain_text("page 2 of")
    await expect(page.locator("#runs tr[data-run]").first).to_have_attribute("data-run", failed[-51])
    await page.goto(f"{runview_stack.console_url}/runs?status=failed&tenant=t1&min_cost=0.005&q=bulk")
    expected = [r for r in failed if int(r[8:]) % 3 == 1 and int(r[8:]) % 10 >= 5]
    await expect(count).to_contain_text(f"{len(expected)} run(s) match")
    await page.goto(f"{runview_stack.console_url}/runs?min_cost=lots")
    await expect(page.locator("#runs-error")).to_contain_text("cost 'lots': a number of dollars")
    await page.goto(f"{runview_stack.console_url}/runs?status=failed")
    await shot(page, "runs-list.png", tmp_path)
    await no_serious_violations(page)
    await page.close()
