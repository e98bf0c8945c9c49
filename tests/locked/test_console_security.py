"""The console under attack, on a locked stack: the generated auth.conf, the escalation service and two
console replicas each as their own NATS user, driven over real HTTP and in a real browser.

Each test makes one attack of the security review (D10-D14, D23) and checks its effect: a slow login
stalls nobody, a page on another port of the host cannot act as the operator, a logout ends the session
on every replica, login answers say nothing about which names exist and stop a guesser, the pages run
under a strict Content-Security-Policy, and the log keeps no typed name. Requests come from distinct
loopback addresses (127.0.0.x) so each test meets the login throttle on its own.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import statistics
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import bcrypt
import pytest
from playwright.async_api import Browser, async_playwright, expect

from loopwarden.client import Client
from loopwarden.console.local import url_from_log
from loopwarden.stack import LocalStack, Proc, free_port
from shared import subjects as S
from shared.messages import EscalationRaise
from shared.permissions import operator_roster
from shared.settings import Settings
from tests.support import locked as L
from tests.support.console import CHROMIUM, CHROMIUM_FLAGS, Answer, login, request, session_cookie
from tests.support.http_server import LocalHttpServer, QuietHandler
from tests.support.stacks import TEST_ENV
from tests.support.timing import bound, eventually, polls

COST = 12  # the real work factor (local.py writes 10; the review saw 10-12)
PASSWORDS = {"alice": "alice-pw-7", "carol": "carol-pw-7", "erin": "erin-pw-7", "frank": "frank-pw-7"}
SLOW = ("erin", "frank")  # hashed at the real cost; the others cheaply, to keep the browser steps fast
SECRET = "one-secret-for-every-replica"

pytestmark = pytest.mark.skipif(
    not shutil.which(CHROMIUM) and not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} missing"
)


@dataclass
class Consoles:
    nats_url: str
    a: str  # two replicas of one console: same users, same secret, one NATS user
    b: str
    log_a: Path


def _url(proc: Proc) -> str:
    found = url_from_log(proc.log.read_text(errors="replace"))
    assert found, proc.log.read_text(errors="replace")[-2000:]
    return found


@pytest.fixture(scope="module")
def consoles(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Consoles]:
    tmp = tmp_path_factory.mktemp("console-security")
    users = {
        u: bcrypt.hashpw(p.encode(), bcrypt.gensalt(COST if u in SLOW else 4)).decode() for u, p in PASSWORDS.items()
    }
    console_env = {
        **L.creds("console"),
        "LW_CONSOLE_USERS": json.dumps(users),
        "LW_CONSOLE_SECRET": SECRET,
        "LW_CONSOLE_PORT": "0",
    }
    with L.locked_server(tmp, "console-security") as url:
        stack = LocalStack(
            state_dir=tmp,
            nats_url=url,
            env=TEST_ENV,
            services=("escalation",),
            env_per_service={
                "escalation": {**L.creds("escalation"), "LW_OPERATORS": operator_roster()},
                "console": console_env,
            },
        )
        try:
            asyncio.run(L.bootstrap_as_admin(url))
            stack.start()
            a = stack.start_service("console", label="console-a")
            b = stack.start_service("console", label="console-b")
            stack.wait_ready([a, b])
            yield Consoles(url, _url(a), _url(b), a.log)
            logs = "".join(p.log.read_text(errors="replace") for p in stack.procs)
            assert "permissions violation" not in logs.lower(), logs[-3000:]
        finally:
            stack.stop()


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield b
        await b.close()


@pytest.fixture
async def admin(consoles: Consoles) -> AsyncIterator[Client]:
    settings = L.as_user(consoles.nats_url, "admin", manage_streams=False, rpc_timeout_s=2)
    async with Client(settings, identity="admin") as c:
        yield c


# --- plain HTTP from a chosen loopback address ---------------------------------------------------


def csrf_of(html: str) -> str:
    """The form token a page of the console carries ("" when it has none)."""
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    return found.group(1) if found else ""


async def queued(admin: Client) -> str:
    esc_id = f"esc-console-{free_port()}"
    raise_ = EscalationRaise(escalation_id=esc_id, run_id=f"run-{esc_id}", kind="fatal", reason="needs a person")
    await admin.bus.publish(S.ESCALATION_RAISE, raise_, msg_id=f"raise.{esc_id}")
    for _ in range(polls(100)):
        if (await admin.show(esc_id)).ok:
            return esc_id
        await asyncio.sleep(0.05)
    raise AssertionError(f"{esc_id} was never queued")


# --- D10: bcrypt off the event loop, logins throttled ---------------------------------------------


async def test_sixteen_concurrent_failed_logins_leave_healthz_answering_at_once_and_are_throttled(
    consoles: Consoles,
) -> None:
    hashed = bcrypt.hashpw(b"x", bcrypt.gensalt(COST))
    started = time.perf_counter()
    bcrypt.checkpw(b"y", hashed)
    one_check = time.perf_counter() - started  # on this machine, now: what each login costs the console
    source = "127.0.0.20"
    answers: list[Answer] = []

    def guess(i: int) -> None:
        answers.append(login(consoles.a, "erin", f"guess-{i}", source))

    threads = [threading.Thread(target=guess, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    await asyncio.sleep(0.1)  # the logins are in
    health = await asyncio.to_thread(request, consoles.a, "GET", "/healthz")
    # the right password, as soon as the guessing holds the name (its first refusal): it does not get
    # through (asked then, not after every guess has ended: a loaded machine can take longer than the
    # 5 s the name is held)
    await eventually(lambda: any(a.status == 429 for a in answers), what="a guess refused with 429", within=bound(30))
    right = await asyncio.to_thread(login, consoles.a, "erin", PASSWORDS["erin"], source)
    for t in threads:
        await asyncio.to_thread(t.join)
    # On the event loop the 16 checks run one after another before /healthz is read: 16 x one_check
    # (5.8 s in the review). Off the loop it answers in milliseconds, whatever the machine's load.
    limit = max(0.75, 16 * one_check / 4)
    assert health.status == 200 and health.seconds < limit, (health.seconds, limit, one_check)
    statuses = sorted(a.status for a in answers)
    assert set(statuses) == {401, 429} and statuses.count(401) <= 5, statuses  # 5 free tries per name
    assert all("try again in" in a.body for a in answers if a.status == 429)
    assert all(a.headers.get("Retry-After") for a in answers if a.status == 429)
    # the right password did not get through while the guessing held the name
    assert right.status == 429 and right.cookie() is None, right.status


def logins_counted(metrics: str, result: str) -> float:
    found = re.search(
        rf'^loopwarden_console_logins_total\{{[^}}]*result="{result}"[^}}]*\}} (\S+)$', metrics, flags=re.M
    )
    return float(found.group(1)) if found else 0.0


async def test_the_console_serves_its_metrics_with_logins_by_result(consoles: Consoles) -> None:
    """``/metrics`` beside ``/healthz`` (docs/observability.md): a failed login is counted as one."""
    first = await asyncio.to_thread(request, consoles.b, "GET", "/metrics")
    assert first.status == 200 and first.headers["content-type"].startswith("text/plain; version=0.0.4")
    failed = logins_counted(first.body, "failed")
    answer = await asyncio.to_thread(login, consoles.b, "erin", "not-her-password", "127.0.0.31")
    assert answer.status == 401

    async def counted() -> bool:  # a scrape within a second of the last gets the same answer
        now = await asyncio.to_thread(request, consoles.b, "GET", "/metrics")
        return logins_counted(now.body, "failed") == failed + 1

    await eventually(counted, what="the failed login on /metrics", within=bound(10), every=0.3)


# --- D11: CSRF -----------------------------------------------------------------------------------


def attacker_page(console: str, esc_id: str) -> type[BaseHTTPRequestHandler]:
    html = f"""<!doctype html><html><body>
<form id="f" method="post" action="{console}/escalations/{esc_id}/resolve">
<input type="hidden" name="action" value="abort"><input type="hidden" name="note" value="csrf">
</form><script>document.getElementById("f").submit();</script></body></html>""".encode()

    class Page(QuietHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(html)))
            self.end_headers()
            self.wfile.write(html)

    return Page


async def test_a_page_on_another_port_of_the_host_cannot_resolve_as_the_logged_in_operator(
    consoles: Consoles, browser: Browser, admin: Client
) -> None:
    esc_id = await queued(admin)
    context = await browser.new_context()
    page = await context.new_page()
    page.set_default_timeout(15_000)
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    await page.goto(f"{consoles.a}/escalations/{esc_id}")
    await page.fill("input[name=operator]", "alice")
    await page.fill("input[name=password]", PASSWORDS["alice"])
    await page.click("button[type=submit]")
    await page.click("#claim")  # the console's own form, with its token: taken
    await expect(page.locator("#flash")).to_have_text("claim: done")
    await expect(page.locator("#item-status")).to_have_text("claimed")
    assert isinstance(await page.evaluate("window.lwLoadedAt"), int)  # the nonce'd script ran
    header = await page.evaluate("getComputedStyle(document.querySelector('header')).backgroundColor")
    assert header == "rgb(29, 35, 48)"  # and the nonce'd style applies

    server = LocalHttpServer(attacker_page(consoles.a, esc_id)).start()  # same host, another port: same site
    try:
        evil = await context.new_page()
        await evil.goto(server.url)
        await evil.wait_for_url(re.compile(re.escape(f"{consoles.a}/escalations/{esc_id}")))  # it did post
        await evil.wait_for_load_state()
        evil_url, evil_text = evil.url, await evil.content()
        await evil.close()
    finally:
        server.stop()
    item = (await admin.show(esc_id)).escalations[0]
    assert item.status == "claimed" and item.resolution is None, item
    assert [e.kind for e in item.trail] == ["claimed"]
    assert evil_url.endswith("/resolve") and "refused" in evil_text, (evil_url, evil_text[:300])

    # the right Origin without the session's token is refused too (a same-origin page it did not render)
    cookie = (await context.cookies(consoles.a))[0]
    forged = await asyncio.to_thread(
        request,
        consoles.a,
        "POST",
        f"/escalations/{esc_id}/resolve",
        form={"action": "abort"},
        headers={"Cookie": f"{cookie['name']}={cookie['value']}"},
    )
    assert forged.status == 403 and "refused" in forged.body, (forged.status, forged.body[:200])
    assert (await admin.show(esc_id)).escalations[0].resolution is None
    await page.check("#confirm-abort")  # an abort is confirmed on the page (issue 26)
    await page.click("#do-abort")  # and the operator's own form still works
    await expect(page.locator("#flash")).to_have_text("resolve: done")
    assert not problems, problems  # nothing blocked by the Content-Security-Policy, no script errors
    await context.close()


# --- D12: logout on every replica ----------------------------------------------------------------


async def test_a_logout_on_one_replica_ends_the_session_on_the_other(consoles: Consoles) -> None:
    source = "127.0.0.40"
    answer = await asyncio.to_thread(login, consoles.a, "alice", PASSWORDS["alice"], source)
    cookie = session_cookie(answer)
    on_b = await asyncio.to_thread(request, consoles.b, "GET", "/runs", source=source, headers={"Cookie": cookie})
    assert on_b.status == 200  # any replica accepts a live session
    page = await asyncio.to_thread(request, consoles.a, "GET", "/runs", source=source, headers={"Cookie": cookie})
    out = await asyncio.to_thread(
        request,
        consoles.a,
        "POST",
        "/logout",
        source=source,
        form={"csrf": csrf_of(page.body)},
        headers={"Cookie": cookie},
    )
    assert out.status == 303
    for base in (consoles.b, consoles.a):
        after = await asyncio.to_thread(request, base, "GET", "/runs", source=source, headers={"Cookie": cookie})
        assert after.status == 303 and after.headers["Location"].startswith("/login"), (base, after.status)
        fragment = await asyncio.to_thread(
            request, base, "GET", "/runs/rows", source=source, headers={"Cookie": cookie}
        )
        assert fragment.status == 401
    max_age = re.search(r"Max-Age=(\d+)", answer.cookie() or "")
    assert max_age and int(max_age.group(1)) <= 3600  # an hour, not 12


# --- D13: no oracle, no 500, no endless guessing ---------------------------------------------------


async def test_a_password_over_72_bytes_is_a_clear_400_for_known_and_unknown_operators(consoles: Consoles) -> None:
    for name in ("alice", "nobody-at-all"):
        answer = await asyncio.to_thread(login, consoles.b, name, "a" * 100, "127.0.0.50")
        assert answer.status == 400 and "a password is at most 72 bytes" in answer.body, (name, answer.status)


async def test_known_and_unknown_operators_take_comparable_time(consoles: Consoles) -> None:
    known, unknown = [], []
    for i in range(3):  # interleaved, so a change in the machine's load touches both alike
        known.append((await asyncio.to_thread(login, consoles.b, "frank", f"wrong-{i}", "127.0.0.51")).seconds)
        unknown.append((await asyncio.to_thread(login, consoles.b, f"nobody{i}", "wrong", "127.0.0.52")).seconds)
    # the review: 409 ms vs 15 ms. The same work either way: within a factor of two.
    assert statistics.median(unknown) > statistics.median(known) / 2, (known, unknown)


async def test_repeated_failures_lock_the_name_out_even_with_the_right_password(consoles: Consoles) -> None:
    statuses = []
    for i in range(8):
        statuses.append((await asyncio.to_thread(login, consoles.b, "carol", f"guess-{i}", f"127.0.0.{60 + i}")).status)
    assert statuses[:5] == [401] * 5 and 429 in statuses, statuses  # from any address: the name counts
    right = await asyncio.to_thread(login, consoles.b, "carol", PASSWORDS["carol"], "127.0.0.70")
    assert right.status == 429 and "too many failed logins for this operator" in right.body, right.status


# --- D14: headers and the cookie ---------------------------------------------------------------------


async def test_every_answer_says_what_the_browser_may_run_frame_and_sniff(consoles: Consoles) -> None:
    for path in ("/login", "/healthz", "/asyncapi.json"):
        headers = (await asyncio.to_thread(request, consoles.a, "GET", path, source="127.0.0.80")).headers
        csp = headers["Content-Security-Policy"] or ""
        assert "frame-ancestors 'none'" in csp and "script-src 'nonce-" in csp and "unsafe-inline" not in csp, path
        assert headers["X-Frame-Options"] == "DENY" and headers["X-Content-Type-Options"] == "nosniff", path
        assert headers["Referrer-Policy"] == "same-origin", path
    page = await asyncio.to_thread(request, consoles.a, "GET", "/login", source="127.0.0.80")
    nonce = re.search(r"'nonce-([^']+)'", page.headers["Content-Security-Policy"] or "")
    assert nonce and page.body.count(f'nonce="{nonce.group(1)}"') == 2  # the style and the script, nothing else


async def test_the_session_cookie_is_secure_behind_a_tls_proxy_and_not_on_plain_http(consoles: Consoles) -> None:
    plain = await asyncio.to_thread(login, consoles.a, "alice", PASSWORDS["alice"], "127.0.0.1")
    assert "secure" not in (plain.cookie() or "").lower().split("; ")
    https_origin = consoles.a.replace("http://", "https://")
    proxied = await asyncio.to_thread(
        login,
        consoles.a,
        "alice",
        PASSWORDS["alice"],
        "127.0.0.1",  # the proxy (uvicorn trusts X-Forwarded-* from 127.0.0.1 only)
        headers={"X-Forwarded-Proto": "https", "Origin": https_origin},
    )
    cookie = proxied.cookie()
    assert proxied.status == 303 and cookie and "secure" in cookie.lower().split("; "), (proxied.status, cookie)


# --- D23: the log ----------------------------------------------------------------------------------


async def test_a_failed_login_logs_neither_the_typed_name_nor_anything_like_a_password(consoles: Consoles) -> None:
    marker = "Hunter2-Typed-In-The-Name-Field"
    answer = await asyncio.to_thread(login, consoles.a, marker, "whatever", "127.0.0.90")
    assert answer.status == 401
    await asyncio.sleep(bound(0.3))
    log = consoles.log_a.read_text(errors="replace")
    assert marker.lower() not in log.lower(), [line for line in log.splitlines() if "failed login" in line]
    assert "failed login for an unknown name #" in log  # still logged, as a keyed digest


def test_settings_keep_console_sessions_short_by_default() -> None:
    assert Settings().console_session_s <= 3600
