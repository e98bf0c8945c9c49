"""The operator console: an ASGI app (Starlette) with server-rendered pages.

Runs (status, cost, timeline, link to the trace in Jaeger), the queue with its filters, an
item's detail with its context and one form per allowed action. Pages refresh their live
parts by polling small HTML fragments, so nothing reloads. Operators log in; every claim,
renewal and resolution goes to the escalation service on ``...<verb>.console.<operator>``,
a subject only the console's NATS user may publish to, and is recorded with both names.

A form that changes something is taken only from the console's own pages with the session's token
(``guard``); logins are throttled per address and per name (``throttle``) and checked off the event
loop; a logout is revoked in ``lw_console_sessions``, which every replica reads.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from nats.js.errors import KeyNotFoundError
from opentelemetry.metrics import Counter
from starlette.applications import Starlette
from starlette.datastructures import MutableHeaders
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from loopwarden import records as R
from loopwarden import replay as RP
from loopwarden import runtree as T
from loopwarden.client import Client, PermissionDenied
from loopwarden.console import board as B
from loopwarden.console import guard as G
from loopwarden.console.auth import SESSION_COOKIE, PasswordTooLong, Session, Sessions
from loopwarden.console.live import LiveView
from loopwarden.console.throttle import LoginThrottle
from loopwarden.data import schemas_dir
from shared import subjects as S
from shared.contracts.catalogue import ContractCatalogue
from shared.escalation_actions import ACTIONS, KINDS, parse_action, withheld
from shared.health import METRICS_CONTENT_TYPE
from shared.live_config import ConfigUnreadable, LiveConfig
from shared.messages import EscalationAction, EscalationReply, utcnow
from shared.metrics import CONSOLE_LOGINS
from shared.records import TERMINAL, scenario_from_record
from shared.scenario import ScenarioError, parse_scenario
from shared.settings import Settings
from shared.telemetry import Telemetry

log = logging.getLogger("loopwarden.console")
TEMPLATES = Path(__file__).parent / "templates"
Page = Callable[[Request], Awaitable[Response]]
VIA = "console"
STREAM_S = 300.0  # an event stream is closed after this; the browser opens a new one


def _env() -> Environment:
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html"]))
    env.filters["pretty"] = lambda v: json.dumps(v, indent=2, ensure_ascii=False, default=str)
    env.filters["hms"] = lambda v: v.astimezone(UTC).strftime("%H:%M:%S") if isinstance(v, datetime) else ""
    env.filters["duration"] = T.duration
    env.filters["clip"] = T.clip
    env.globals["bar"] = T.bar
    env.globals["ACTIONS"] = ACTIONS  # the queue's forms: what each action must carry (shared/escalation_actions.py)
    env.globals["KINDS"] = list(KINDS)
    return env


class SecurityHeaders:
    """Every response says what the browser may run, frame and sniff (``guard.security_headers``); the
    request's script nonce is in ``request.state.csp_nonce`` for the templates."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        nonce = secrets.token_urlsafe(16)
        scope.setdefault("state", {})["csp_nonce"] = nonce

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in G.security_headers(nonce).items():
                    headers[name] = value
            await send(message)

        await self.app(scope, receive, send_with_headers)


class BusRevocations:
    """Logouts in ``lw_console_sessions``: every replica reads them, and they outlive a restart."""

    def __init__(self, client: Client) -> None:
        self.client = client

    async def revoke(self, sid: str, expires: int) -> None:
        kv = await self.client.bus.kv(S.KV_CONSOLE_SESSIONS)
        await kv.put(S.kv_key("revoked", sid), str(expires).encode())

    async def revoked(self, sid: str) -> bool:
        kv = await self.client.bus.kv(S.KV_CONSOLE_SESSIONS)
        try:
            await kv.get(S.kv_key("revoked", sid))
        except KeyNotFoundError:
            return False
        return True


class Console:
    def __init__(self, settings: Settings, client: Client, sessions: Sessions) -> None:
        self.settings = settings
        self.client = client
        self.sessions = sessions
        self.throttle = LoginThrottle()
        self.live = LiveView(client, settings)
        self.catalogue = ContractCatalogue(client.bus)  # the tools' output schemas, beside the provide-result box
        self.env = _env()
        self.env.globals["tenant_of"] = lambda run_id: row.tenant if (row := self.live.runs.get(run_id)) else ""
        self.roster: dict[str, list[str]] | None = json.loads(settings.operators) if settings.operators else None
        # the logins and the roster as applied (lw_config), else LW_CONSOLE_USERS / LW_OPERATORS: ``sync_people``
        self.people = LiveConfig(client.bus)
        self.configured_users = dict(sessions.users)
        self.metrics: Callable[[], bytes] | None = None  # the process's Prometheus text (``/metrics``), when served
        self.logins: Counter | None = None

    async def sync_people(self) -> None:
        """The logins and the roster as an admin applied them (at most ``LW_CONFIG_REFRESH_S`` old): an operator
        added can log in, one removed cannot (and its sessions end), without a restart."""
        applied = await self.people.console_users()
        self.sessions.users = applied if applied is not None else self.configured_users
        self.roster = await self.people.roster()

    def observed(self, telemetry: Telemetry) -> None:
        """Serve the process's metrics on ``/metrics`` and count logins by result (docs/observability.md)."""
        self.metrics = telemetry.prometheus_text
        self.logins = telemetry.meter("loopwarden.console").create_counter(
            CONSOLE_LOGINS, description="console logins by result: ok, failed, throttled"
        )
        for result in ("ok", "failed", "throttled"):  # at 0 from the start: the first of each is an increase
            self.logins.add(0, {"result": result})

    def count_login(self, result: str) -> None:
        if self.logins is not None:
            self.logins.add(1, {"result": result})

    # --- plumbing ---------------------------------------------------------------------------------
    def render(self, request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        session: Session | None = getattr(request.state, "session", None)
        html = self.env.get_template(name).render(
            jaeger_url=self.settings.jaeger_url,
            csp_nonce=getattr(request.state, "csp_nonce", ""),
            csrf=self.sessions.csrf(session) if session else "",
            **context,
        )
        return HTMLResponse(html, status_code=status)

    def refusal(self, request: Request) -> str | None:
        """Why a state-changing request does not come from the console's own pages (None: it does)."""
        own = G.own_origin(request.url.scheme, request.headers.get("host", ""), self.settings.console_public_url)
        return G.origin_refusal(request.headers.get("origin"), request.headers.get("referer"), own)

    def page(
        self, handler: Callable[[Request, str], Awaitable[Response]], fragment: bool = False, changes: bool = False
    ) -> Page:
        async def guarded(request: Request) -> Response:
            try:
                await self.sync_people()
                session = await self.sessions.session(request.cookies.get(SESSION_COOKIE))
            except Exception as err:  # the shared store is unreachable: nobody is let in meanwhile
                log.warning("console: cannot check the session store: %s", err)
                return PlainTextResponse("the console cannot check sessions right now", status_code=503)
            if session is None:
                if fragment or changes:
                    return PlainTextResponse("log in again", status_code=401)
                target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                return RedirectResponse(f"/login?next={quote(target)}", status_code=303)
            if changes:
                refused = self.refusal(request)
                form = await request.form()
                if refused is None and not self.sessions.csrf_ok(session, str(form.get("csrf", ""))):
                    refused = "refused: the form is stale or not the console's own (reload the page)"
                if refused is not None:
                    log.warning("console: %s %s %s", session.operator, request.url.path, refused)
                    return PlainTextResponse(refused, status_code=403)
            request.state.session = session
            bad = G.bad_path_id(request.path_params)
            if bad is not None:
                what = bad.removesuffix("_id").replace("_", " ")
                return PlainTextResponse(f"no such {what}", status_code=404)
            return await handler(request, session.operator)

        return guarded

    def routes(self) -> list[Route]:
        p = self.page
        return [
            Route("/healthz", self.healthz),
            Route("/metrics", self.metrics_text),
            Route("/asyncapi.json", asyncapi_document),
            Route("/login", self.login_form, methods=["GET"]),
            Route("/login", self.login, methods=["POST"]),
            Route("/logout", p(self.logout, changes=True), methods=["POST"]),
            Route("/", p(self.home)),
            Route("/runs", p(self.runs_page)),
            Route("/runs/rows", p(self.runs_rows, fragment=True)),
            Route("/runs/{run_id}", p(self.run_page)),
            Route("/runs/{run_id}/live", p(self.run_tree, fragment=True)),
            Route("/runs/{run_id}/tree", p(self.run_tree, fragment=True)),
            Route("/runs/{run_id}/stream", p(self.run_stream, fragment=True)),
            Route("/runs/{run_id}/export", p(self.run_export, fragment=True)),
            Route("/runs/{run_id}/steps/{step_id}", p(self.run_step, fragment=True)),
            Route("/runs/{run_id}/replay", p(self.replay_run, changes=True), methods=["POST"]),
            Route("/runs/{run_id}/replays/{replay_id}", p(self.replay_result, fragment=True)),
            Route("/fleet", p(self.fleet_page)),
            Route("/fleet/rows", p(self.fleet_rows, fragment=True)),
            Route("/queue", p(self.queue_page)),
            Route("/queue/rows", p(self.queue_rows, fragment=True)),
            Route("/escalations/{escalation_id}", p(self.item_page)),
            Route("/escalations/{escalation_id}/live", p(self.item_live, fragment=True)),
            Route("/escalations/{escalation_id}/{verb}", p(self.act, changes=True), methods=["POST"]),
        ]

    # --- login ------------------------------------------------------------------------------------
    async def healthz(self, request: Request) -> Response:
        """200 while the console can reach NATS (or is reconnecting); 503 once its connection is closed for good
        (nats-py does not reconnect then): the process exits non-zero too, for its supervisor to restart it."""
        if self.client.bus.closed_for_good.is_set():
            return PlainTextResponse("the NATS connection is closed for good; restarting", status_code=503)
        return PlainTextResponse("ok")

    async def metrics_text(self, request: Request) -> Response:
        """The console process's metrics in the Prometheus text format (docs/observability.md)."""
        if self.metrics is None:
            return PlainTextResponse("no metrics here", status_code=404)
        return Response(self.metrics(), media_type=METRICS_CONTENT_TYPE)

    async def login_form(self, request: Request) -> Response:
        nxt = request.query_params.get("next", "/queue")
        return self.render(request, "login.html", next=nxt, error=None, operator=None)

    async def login(self, request: Request) -> Response:
        form = await request.form()
        name, password = str(form.get("operator", ""))[:200], str(form.get("password", ""))
        target = str(form.get("next") or "/queue")
        if not target.startswith("/") or target.startswith("//"):
            target = "/queue"

        def refuse(status: int, error: str, headers: dict[str, str] | None = None) -> Response:
            response = self.render(request, "login.html", status, next=target, error=error, operator=None)
            response.headers.update(headers or {})
            return response

        refused = self.refusal(request)
        if refused is not None:
            return refuse(403, refused)
        address = request.client.host if request.client else "?"
        throttled = self.throttle.attempt(address, name, time.monotonic())
        if throttled is not None:
            who = self.sessions.who(name)
            log.warning("console: login for %s from %s not tried: %s", who, address, throttled.message)
            self.count_login("throttled")
            return refuse(429, throttled.message, {"Retry-After": str(max(1, round(throttled.wait_s)))})
        try:
            await self.sync_people()
        except ConfigUnreadable as err:
            log.warning("console: cannot read the logins: %s", err)
            return refuse(503, "the console cannot check logins right now")
        try:
            token = await self.sessions.login(name, password)
        except PasswordTooLong as err:
            return refuse(400, str(err))
        if token is None:
            log.warning("console: failed login for %s from %s", self.sessions.who(name), address)
            self.count_login("failed")
            return refuse(401, "unknown operator or wrong password")
        self.throttle.succeeded(address, name)
        log.info("console: %s logged in", name)
        self.count_login("ok")
        response = RedirectResponse(target, status_code=303)
        secure = self.settings.console_secure_cookie or request.url.scheme == "https"
        response.set_cookie(
            SESSION_COOKIE,
            token,
            max_age=int(self.sessions.ttl_s),
            httponly=True,
            samesite="strict",
            secure=secure,
        )
        return response

    async def logout(self, request: Request, operator: str) -> Response:
        await self.sessions.logout(request.cookies.get(SESSION_COOKIE))
        log.info("console: %s logged out", operator)
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(SESSION_COOKIE)
        return response

    # --- runs -------------------------------------------------------------------------------------
    async def home(self, request: Request, operator: str) -> Response:
        return RedirectResponse("/queue", status_code=303)

    def _trace(self, run_id: str) -> str | None:
        timeline = self.live.timelines.get(run_id)
        return B.jaeger_link(self.settings.jaeger_url, timeline.trace_id if timeline else None)

    def _runs(self, request: Request) -> dict[str, Any]:
        q = request.query_params
        filters = {
            k: q.get(k, "")
            for k in ("status", "agent", "tenant", "tool", "failure", "q", "newer_than", "older_than", "min_cost")
        }
        try:
            flt, error = B.RunFilter.from_query(filters), None
        except ValueError as err:
            flt, error = B.RunFilter(), str(err)
        try:
            number = int(q.get("page", "1"))
        except ValueError:
            number = 1
        started = time.perf_counter()
        page = self.live.page(flt, number, time.time())
        took_ms = (time.perf_counter() - started) * 1000
        query = {k: v for k, v in filters.items() if v}
        return {
            "filters": filters,
            "error": error,
            "page": page,
            "took_ms": took_ms,
            "query": urlencode(query),
            "prev_query": urlencode({**query, "page": page.page - 1}),
            "next_query": urlencode({**query, "page": page.page + 1}),
            "statuses": B.RUN_STATUSES,
            "failure_types": sorted({t for types in self.live.failures.values() for t in types}),
            "trace": self._trace,
        }

    async def runs_page(self, request: Request, operator: str) -> Response:
        return self.render(request, "runs.html", operator=operator, **self._runs(request))

    async def runs_rows(self, request: Request, operator: str) -> Response:
        return self.render(request, "runs_rows.html", **self._runs(request))

    async def _tree_context(self, run_id: str) -> dict[str, Any]:
        record, note = await self.live.record(run_id)
        items = (await self.client.escalations("all", run_id)).escalations
        tree = T.build(record) if record is not None else None
        seen, updated = self.live.version(run_id)
        trace = tree.trace_id if tree and tree.trace_id else None
        return {
            "run_id": run_id,
            "record": record,
            "tree": tree,
            "note": note if record is not None else None,
            "error": note if record is None else None,
            "trace_link": B.jaeger_link(self.settings.jaeger_url, trace) or self._trace(run_id),
            "stream": f"/runs/{quote(run_id)}/stream?{urlencode({'seen': seen, 'updated': updated})}",
            "timeline": self.live.timelines.get(run_id) or B.RunTimeline(),
            "items": items,
        }

    async def run_page(self, request: Request, operator: str) -> Response:
        context = await self._tree_context(request.path_params["run_id"])
        status = 200 if context["record"] is not None else 404
        q = request.query_params
        return self.render(
            request,
            "run.html",
            status,
            operator=operator,
            replay=q.get("replay") or None,
            replay_live=q.get("live") == "1",
            replay_error=q.get("replay_error") or None,
            **context,
        )

    async def run_tree(self, request: Request, operator: str) -> Response:
        return self.render(request, "run_tree.html", **await self._tree_context(request.path_params["run_id"]))

    async def run_step(self, request: Request, operator: str) -> Response:
        record, _ = await self.live.record(request.path_params["run_id"])
        sections = T.step_detail(record, request.path_params["step_id"]) if record is not None else []
        status = 200 if sections else 404
        return self.render(request, "run_step.html", status, sections=sections)

    async def run_export(self, request: Request, operator: str) -> Response:
        run_id = request.path_params["run_id"]
        record, note = await self.live.record(run_id)
        if record is None:
            return PlainTextResponse(note or "no such run", status_code=404)
        if note is not None:  # only part of the record could be read: never handed out as if it were whole
            return PlainTextResponse(
                f"the export of {run_id} is incomplete, so it is not offered: {note} (the console's NATS user "
                "needs read on every bucket of a run: deploy/nats/auth.conf)",
                status_code=503,
            )
        headers = {"Content-Disposition": f'attachment; filename="{run_id}.json"'}
        return Response(record.model_dump_json(indent=2, by_alias=True), media_type="application/json", headers=headers)

    # --- replay -----------------------------------------------------------------------------------
    async def replay_run(self, request: Request, operator: str) -> Response:
        """Replay the run's recorded model turns (and tool outputs, judge replies) through the current code,
        as ``loopwarden replay`` does: a dry run unless the form ticks ``live_tools``. The page then follows
        the replay and shows its call-for-call comparison."""
        run_id = request.path_params["run_id"]
        live_tools = (await request.form()).get("live_tools") == "yes"
        back = f"/runs/{quote(run_id)}"

        def refused(reason: str) -> Response:
            log.warning("console: %s replay %s refused: %s", operator, run_id, reason)
            return RedirectResponse(f"{back}?{urlencode({'replay_error': reason})}", status_code=303)

        if (why := B.replay_refusal(operator, self.roster, live_tools)) is not None:
            return refused(why)
        try:  # read whole and fresh: what is replayed is every recorded turn and output, as the export has them
            record = await R.export_run(self.client.bus, self.settings, run_id)
        except R.RecordNotFound as err:
            return refused(f"replay: {err}")
        except Exception as err:  # a bucket the console's user may not read
            unreadable = type(err).__name__
            return refused(f"replay: the run's model turns and tool outputs are not readable here ({unreadable})")
        if record.status not in TERMINAL:
            return refused(f"replay: the run is still {record.status}; a run is replayed once it has ended")
        try:
            scenario = RP.replay_scenario(record, allow_live_tools=live_tools)
        except RP.LiveToolsRefused as err:
            calls = "; ".join(err.calls[:5]) + (" ..." if len(err.calls) > 5 else "")
            return refused(
                f"replay refused: a replay is a dry run, but {len(err.calls)} call(s) of this run have no recorded "
                f"output and would run the real tool ({calls}); tick 'run the real tools' to replay it anyway"
            )
        except ScenarioError as err:
            return refused(f"replay: the run does not make a replayable scenario: {err}")
        try:  # on the operators' replay subject, charged to the recorded run's tenant
            replay_id = await RP.start_replay(self.client, record, scenario)
        except PermissionDenied as err:
            return refused(f"replay: {err}")
        log.info("console: %s replays %s as %s%s", operator, run_id, replay_id, " (live tools)" if live_tools else "")
        query = {"replay": replay_id, **({"live": "1"} if live_tools else {})}
        return RedirectResponse(f"{back}?{urlencode(query)}#replay", status_code=303)

    async def replay_result(self, request: Request, operator: str) -> Response:
        """Where a replay is: running, or ended and compared with the recorded run (``data-done``)."""
        run_id, replay_id = request.path_params["run_id"], request.path_params["replay_id"]
        record, note = await self.live.record(run_id)
        if record is None:
            return PlainTextResponse(note or f"run {run_id}: not found", status_code=404)
        state = await self.client.state(replay_id)
        events = (await R.run_events(self.client.bus, replay_id))[0] if state is not None else []
        # a replay stops where the recording had a person (the person's answer is not played back): compared there
        ended = state is not None and (
            state.status == "awaiting_human"
            or (state.status in TERMINAL and any(e.kind == f"run.{state.status}" for e in events))
        )
        report = None
        if ended and state is not None:
            expect = parse_scenario(scenario_from_record(record), f"export of {run_id}")
            report = RP.compare(record, replay_id, state.status, events, await self.client.check(expect, state))
        return self.render(
            request,
            "replay_result.html",
            run_id=run_id,
            replay_id=replay_id,
            replay_status=state.status if state is not None else "submitted",
            report=report,
        )

    async def run_stream(self, request: Request, operator: str) -> Response:
        """Server-sent events: ``changed`` whenever the run has a new event or record, ``end`` once it is
        finished (the page then stops listening)."""
        run_id = request.path_params["run_id"]
        q = request.query_params
        try:
            last: tuple[int, str] = (int(q.get("seen", "0")), q.get("updated", ""))
        except ValueError:
            last = (0, "")

        async def events() -> AsyncIterator[str]:
            seen, quiet_since, started = last, time.monotonic(), time.monotonic()
            yield "retry: 1000\n\n"
            while time.monotonic() - started < STREAM_S:
                now = self.live.version(run_id)
                if now != seen:
                    seen, quiet_since = now, time.monotonic()
                    yield f"event: changed\ndata: {now[0]}\n\n"
                row = self.live.runs.get(run_id)
                if row is not None and row.status in TERMINAL and time.monotonic() - quiet_since > 1.0:
                    yield "event: end\ndata: finished\n\n"  # finished, and nothing more came for a second
                    return
                await asyncio.sleep(0.25)

        return StreamingResponse(events(), media_type="text/event-stream")

    # --- the queue --------------------------------------------------------------------------------
    async def _queue(self, request: Request) -> tuple[dict[str, str], EscalationReply]:
        q = request.query_params
        filters = {k: q.get(k, "") for k in ("status", "kind", "tool", "run", "older_than", "newer_than")}
        filters["status"] = filters["status"] or "open"
        try:
            reply = await self.client.escalations(
                filters["status"],
                filters["run"] or None,
                kind=filters["kind"] or None,
                tool=filters["tool"] or None,
                older_than_s=B.parse_age(filters["older_than"]),
                newer_than_s=B.parse_age(filters["newer_than"]),
            )
        except ValueError as err:
            reply = EscalationReply(ok=False, error=str(err))
        return filters, reply

    # --- the fleet (flow control) -----------------------------------------------------------------
    async def fleet_page(self, request: Request, operator: str) -> Response:
        return self.render(request, "fleet.html", operator=operator, **await B.fleet_context(self.client))

    async def fleet_rows(self, request: Request, operator: str) -> Response:
        return self.render(request, "fleet_rows.html", **await B.fleet_context(self.client))

    async def queue_page(self, request: Request, operator: str) -> Response:
        filters, reply = await self._queue(request)
        query = urlencode({k: v for k, v in filters.items() if v})
        return self.render(request, "queue.html", operator=operator, filters=filters, reply=reply, query=query)

    async def queue_rows(self, request: Request, operator: str) -> Response:
        _, reply = await self._queue(request)
        return self.render(request, "queue_rows.html", reply=reply)

    # --- one item ---------------------------------------------------------------------------------
    async def _output_schema(self, tool: str | None) -> tuple[Any, str | None]:
        """The tool's output schema, for the provide-result box (None and why, when it cannot be read)."""
        if not tool:
            return None, "this item names no tool"
        try:
            contract = await self.catalogue.get(tool)
        except Exception as err:  # a deployment where the console's user may not read contracts
            return None, f"the output contract of '{tool}' is not readable here ({type(err).__name__})"
        if contract is None:
            return None, f"no output contract is registered for '{tool}'"
        return contract.output_schema, None

    def _controls(self, item: Any, operator: str) -> B.ItemControls | None:
        if item is None:
            return None
        return B.item_controls(item.status, item.claimed_by, item.lease_expires_at, operator, utcnow())

    async def item_page(self, request: Request, operator: str) -> Response:
        escalation_id = request.path_params["escalation_id"]
        reply = await self.client.show(escalation_id)  # with the run's last turns, read from its conversation now
        status = 200 if reply.ok else 404
        item = reply.escalations[0] if reply.ok else None
        schema, schema_note = (None, None)
        offered = list(item.allowed_actions) if item is not None else []
        if item is not None and withheld(offered, has_contract=False) and item.status != "resolved":
            schema, schema_note = await self._output_schema(item.tool)
            if schema is None and schema_note is not None and schema_note.startswith("no output contract"):
                # a result is checked against the contract: without one it is always refused
                left_out = withheld(offered, has_contract=False)
                offered = [a for a in offered if a not in left_out]
                schema_note = f"{', '.join(a.replace('_', ' ') for a in left_out)} is not offered: {schema_note}"
        return self.render(
            request,
            "item.html",
            status,
            operator=operator,
            reply=reply,
            item=item,
            controls=self._controls(item, operator),
            output_schema=schema,
            schema_note=schema_note,
            offered=offered,
            example=B.example_of(schema) if schema is not None else None,
            escalation_id=escalation_id,
            message=request.query_params.get("message"),
            error=request.query_params.get("error"),
        )

    async def item_live(self, request: Request, operator: str) -> Response:
        reply = await self.client.show(request.path_params["escalation_id"], turns=0)  # the live part shows none
        item = reply.escalations[0] if reply.ok else None
        controls = self._controls(item, operator)
        return self.render(request, "item_live.html", item=item, operator=operator, controls=controls)

    async def act(self, request: Request, operator: str) -> Response:
        escalation_id, verb = request.path_params["escalation_id"], request.path_params["verb"]
        form = await request.form()
        back = f"/escalations/{quote(escalation_id)}"
        try:
            if verb == "claim":
                reply = await self.client.claim(escalation_id, operator, via=VIA)
            elif verb == "renew":
                reply = await self.client.renew(escalation_id, operator, via=VIA)
            elif verb == "resolve":
                action = str(form.get("action", ""))
                if action == "abort" and form.get("confirm") != "yes":
                    raise ValueError("abort: tick 'stop the run' to confirm (an aborted run cannot be resumed)")
                reply = await self.client.resolve(
                    escalation_id, operator, _action(action), str(form.get("note", "")), _result(action, form), via=VIA
                )
            else:
                return PlainTextResponse(f"unknown action {verb}", status_code=404)
        except ValueError as err:
            reply = EscalationReply(ok=False, error=str(err))
        log.info("console: %s %s %s -> %s", operator, verb, escalation_id, "ok" if reply.ok else reply.error)
        key = "message" if reply.ok else "error"
        text = f"{verb}: done" if reply.ok else (reply.error or f"{verb} failed")
        return RedirectResponse(f"{back}?{urlencode({key: text})}", status_code=303)


def _action(value: str) -> EscalationAction:
    return parse_action(value)  # the queue's action table (shared/escalation_actions.py)


def _result(action: str, form: Any) -> Any:
    needs = ACTIONS[_action(action)].needs
    if needs == "json":
        text = str(form.get("result", "")).strip()
        if not text:
            raise ValueError(f"{action} needs the tool's result as JSON")
        try:
            return json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"the result is not JSON: {err.msg} at line {err.lineno} column {err.colno}") from None
    if needs == "text":
        return str(form.get("answer", ""))
    return None


@functools.cache
def _asyncapi_body() -> bytes:
    """The AsyncAPI document as shipped (``make schemas`` writes it; the wheel carries ``schemas/``)."""
    return (schemas_dir() / "asyncapi.json").read_bytes()


async def asyncapi_document(request: Request) -> Response:
    """The AsyncAPI 3.0 document of every channel and contract (public: it holds no run data)."""
    return Response(_asyncapi_body(), media_type="application/json")


def create_app(settings: Settings, client: Client) -> tuple[Starlette, Console]:
    secret = settings.console_secret.get_secret_value() if settings.console_secret else None
    revocations = BusRevocations(client)
    sessions = Sessions.from_settings(settings.console_users, secret, settings.console_session_s, revocations)
    console = Console(settings, client, sessions)
    return Starlette(routes=console.routes(), middleware=[Middleware(SecurityHeaders)]), console
