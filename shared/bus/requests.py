"""Core NATS requests and answers: queue-grouped responders that answer only to an inbox, and
``request`` with its ``ErrorReply`` refusal."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from nats.aio.msg import Msg
from opentelemetry import propagate
from opentelemetry.trace import SpanKind
from pydantic import BaseModel, ValidationError

from shared import opcounts
from shared import subjects as S
from shared.bus.errors import RequestRefused, Undecodable
from shared.bus.letters import Letters
from shared.bus.wire import INBOX_PREFIXES, check_subject
from shared.messages import ErrorReply
from shared.version import version_headers

log = logging.getLogger("loopwarden.bus")
M = TypeVar("M", bound=BaseModel)


@dataclass
class _Responder:
    subject: str
    model: type[Any]
    handler: Callable[..., Awaitable[BaseModel]]
    reply: Callable[[str], BaseModel]
    with_subject: bool = False  # the handler also gets the subject the request arrived on


class Requests(Letters):
    _responders: list[_Responder]  # every subject this replica answers, registered before the start
    dropped_requests: int  # requests not handled: not from a requester, or no inbox to answer
    refused_requests: int  # requests answered with a refusal: malformed, too large, body not fetched
    _rpc_slots: asyncio.Semaphore  # requests answered at once (``LW_MAX_IN_FLIGHT``)

    def _init_state(self) -> None:
        super()._init_state()
        self._responders = []
        self.dropped_requests = 0
        self.refused_requests = 0
        self._rpc_slots = asyncio.Semaphore(self.settings.in_flight_for(self.service))

    def responder(
        self,
        *,
        subject: str,
        model: type[M],
        reply: Callable[[str], BaseModel],
    ) -> Callable[[Callable[[M], Awaitable[BaseModel]]], Callable[[M], Awaitable[BaseModel]]]:
        """Register a queue-grouped request/reply handler. Every request gets an answer: a malformed
        one (or one over its type's body limit, or whose body could not be fetched) is answered with
        ``reply(reason)`` and counted; one whose handler fails is answered so and dead-lettered."""

        def register(handler: Callable[[M], Awaitable[BaseModel]]) -> Callable[[M], Awaitable[BaseModel]]:
            self._responders.append(_Responder(subject, model, handler, reply))
            return handler

        return register

    def subject_responder(
        self,
        *,
        subject: str,
        model: type[M],
        reply: Callable[[str], BaseModel],
    ) -> Callable[[Callable[[M, str], Awaitable[BaseModel]]], Callable[[M, str], Awaitable[BaseModel]]]:
        """``responder`` for handlers that need the subject the request arrived on (e.g. an identity
        token the server's permissions guarantee); ``subject`` may be a wildcard."""

        def register(handler: Callable[[M, str], Awaitable[BaseModel]]) -> Callable[[M, str], Awaitable[BaseModel]]:
            self._responders.append(_Responder(subject, model, handler, reply, with_subject=True))
            return handler

        return register

    def _unanswerable(self, r: _Responder, msg: Msg) -> str | None:
        """Why a request must not be handled at all (None: handle it). A responder takes only what a
        requester published on its own subject: not a stream's push delivery (it keeps the subject it was
        stored on, and its reply is an ack subject), and answers only to an inbox - a reply naming a KV key
        or a command subject would make this service write there."""
        if msg.reply and msg.reply.startswith("$JS.ACK."):
            return "delivered by a JetStream consumer, not sent by a requester"
        if not S.matches(r.subject, msg.subject):
            return f"arrived on {msg.subject[:200]}, not on {r.subject}"
        if msg.reply and not msg.reply.startswith(INBOX_PREFIXES):
            return f"its reply {msg.reply[:200]} is not an inbox"
        return None

    async def _answer(self, r: _Responder, msg: Msg) -> None:
        why = self._unanswerable(r, msg)
        if why is not None:  # dropped, not dead-lettered: a flood of these must not flood LW_DLQ too
            self.dropped_requests += 1
            if self.dropped_requests in (1, 10, 100) or self.dropped_requests % 1000 == 0:
                log.warning("%s: request dropped (%d so far): %s", self.service, self.dropped_requests, why)
            return
        async with self._rpc_slots:
            ctx = self._extract(msg.headers) if self._tracer is not None else None
            with self._span(f"{msg.subject} process", SpanKind.SERVER, ctx, msg.headers):
                try:
                    payload = await self._decode(r.model, msg)
                except Exception as err:  # malformed, over its type's limit, or its body not fetched in time
                    # Answered, not dead-lettered: the requester gets the reason, a request cannot be handed back,
                    # and a letter per bad request would let any requester flood LW_DLQ (its oldest letters go).
                    reason = (
                        str(err) if isinstance(err, Undecodable) else f"the request's body could not be read: {err!r}"
                    )
                    out: BaseModel = r.reply(reason)
                    self._refused_request(msg.subject, reason)
                else:
                    try:
                        out = await (r.handler(payload, msg.subject) if r.with_subject else r.handler(payload))
                    except Exception as err:
                        log.exception("%s: request on %s failed", self.service, msg.subject)
                        reason = f"handler failed: {err!r}"
                        out = r.reply(reason)
                        with contextlib.suppress(Exception):
                            await self.dead_letter(msg, reason, 1)
                if msg.reply:
                    with contextlib.suppress(Exception):
                        body = out.model_dump_json(by_alias=True).encode()
                        await self.nc.publish(msg.reply, body, headers=version_headers(self.service))

    def _refused_request(self, subject: str, reason: str) -> None:
        self.refused_requests += 1
        if self.refused_requests in (1, 10, 100) or self.refused_requests % 1000 == 0:
            log.warning(
                "%s: request on %s refused (%d so far): %s", self.service, subject[:200], self.refused_requests, reason
            )

    async def request(self, subject: str, payload: BaseModel, reply: type[M]) -> M:
        """Core-NATS request/reply (queue-grouped service), decoded into ``reply``; an
        ``ErrorReply`` from the service raises ``RequestRefused`` with its reason."""
        check_subject(subject)
        opcounts.count("rpc")
        headers = {"content-type": "application/json", **version_headers(self.service)}
        data = await self.payloads.offload(self.nc, payload.model_dump_json(by_alias=True).encode(), headers)
        if self._tracer is not None:
            with self._span(f"{subject} publish", SpanKind.CLIENT, None, headers):
                propagate.inject(headers)
                resp = await self.nc.request(subject, data, timeout=self.settings.rpc_timeout_s, headers=headers)
        else:
            resp = await self.nc.request(subject, data, timeout=self.settings.rpc_timeout_s, headers=headers)
        body = await self.payloads.inflate(self.nc, resp.data, resp.headers)
        try:
            return reply.model_validate_json(body)
        except ValidationError:
            try:
                refused = ErrorReply.model_validate_json(body)
            except ValidationError:
                raise
            raise RequestRefused(refused.error) from None
