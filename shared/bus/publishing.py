"""Publishing to JetStream: one message or a batch, their PubAcks awaited together, resent
with the same message id across a failover; the failure counter."""

from __future__ import annotations

import asyncio
import json
import logging
import time

from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import (
    APIError,
    NoStreamResponseError,
    ServiceUnavailableError,
)
from opentelemetry import context as otel_context
from opentelemetry import propagate
from opentelemetry.trace import SpanKind
from pydantic import BaseModel

from shared import subjects as S
from shared.bus.core import BusBase
from shared.bus.errors import describe_nats_error
from shared.bus.replies import _Replies
from shared.bus.wire import MSG_ID_HEADER, RUN_ID_HEADER, _PubAck, landed_where_expected, pub_ack, tenant_headers
from shared.messages.lean import lean_json
from shared.version import version_headers

log = logging.getLogger("loopwarden.bus")


class Publishing(BusBase):
    _replies: _Replies  # the answers to this connection's JetStream requests (PubAcks, direct gets)

    def _init_state(self) -> None:
        super()._init_state()
        self._replies = _Replies(lambda: self.nc, self.settings.js_timeout_s)

    async def publish(
        self,
        subject: str,
        payload: BaseModel | bytes,
        *,
        msg_id: str | None = None,
        run_id: str | None = None,
        traceparent: str | None = None,
    ) -> _PubAck:
        """Publish to JetStream and await its PubAck (returned: ``duplicate`` says the server had the
        message id already); ``msg_id`` makes a re-publish after a crash a no-op. An event that belongs
        to a run goes out with the run id as its last subject token (``S.run_scoped``): ``subject`` is the stem."""
        stem, subject, body, headers = await self._outgoing(subject, payload, msg_id, run_id)
        if self._tracer is not None:
            token = None
            if traceparent:  # continue a stored trace (e.g. a human resolving an escalation)
                token = otel_context.attach(propagate.extract({"traceparent": traceparent}))
            try:
                with self._span(f"{stem} publish", SpanKind.PRODUCER, None, headers):
                    propagate.inject(headers)
                    ack = await self._js_publish(subject, body, headers, repeatable=msg_id is not None)
            finally:
                if token is not None:
                    otel_context.detach(token)
        else:
            ack = await self._js_publish(subject, body, headers, repeatable=msg_id is not None)
        self._count_failure(stem, ack)
        return ack

    async def _outgoing(
        self, subject: str, payload: BaseModel | bytes, msg_id: str | None, run_id: str | None
    ) -> tuple[str, str, bytes, dict[str, str]]:
        """(stem, subject, body, headers) of a message to publish: the run-scoped subject, the body
        (by reference when large), the message id and run id headers, and who sent it (service, version)."""
        headers = {**version_headers(self.service)}  # a copy: the cached dict is shared
        if msg_id:
            headers[MSG_ID_HEADER] = msg_id
        run_id = run_id or getattr(payload, "run_id", None)
        if run_id:
            headers[RUN_ID_HEADER] = run_id
        tenant_headers(headers)
        stem, subject = subject, S.run_scoped(subject, run_id)
        body = payload if isinstance(payload, bytes) else lean_json(payload).encode()
        body = await self.payloads.offload(self.nc, body, headers)
        return stem, subject, body, headers

    async def remove(self, stream: str, seq: int) -> None:
        """Delete message ``seq`` from ``stream``: a message handled for good that nothing reads again (a submit
        once its run is recorded). Marked deleted, not overwritten (``no_erase``); its message id stays in the
        stream's de-duplication window. Raises what the request raised (no answer in time: ``NatsTimeoutError``;
        the server's refusal: its ``APIError``)."""
        reply = await self._replies.request(
            f"$JS.API.STREAM.MSG.DELETE.{stream}", json.dumps({"seq": seq, "no_erase": True}).encode(), None
        )
        answer = json.loads(reply.data or b"{}")
        if answer.get("error") is not None:
            APIError.from_error(answer["error"])

    def _count_failure(self, stem: str, ack: _PubAck) -> None:
        if self._failures is not None and stem.startswith(S.FAILURE_PREFIX + ".") and not ack.duplicate:
            _, ftype, tool = stem.rsplit(".", 2)
            self._failures.add(1, {"failure.type": ftype, "tool": tool})

    async def publish_all(self, items: list[tuple[str, bytes, str | None]], run_id: str | None = None) -> list[_PubAck]:
        """Publish several messages in order and await their PubAcks together (one wait, not one each):
        all are sent, then one timeout covers every PubAck; what failed over (a timeout of a message
        with an id, no stream leader) is sent again with the same message id. Their PubAcks, in order."""
        if len(items) == 1 or self._tracer is not None:  # traced: one span per publish
            return list(
                await asyncio.gather(
                    *(self.publish(subject, body, msg_id=msg_id, run_id=run_id) for subject, body, msg_id in items)
                )
            )
        out = [await self._outgoing(subject, body, msg_id, run_id) for subject, body, msg_id in items]
        acks = await self._js_publish_many(
            [
                (subject, body, headers, msg_id is not None)
                for (_, subject, body, headers), (_, _, msg_id) in zip(out, items, strict=True)
            ]
        )
        for (stem, _, _, _), ack in zip(out, acks, strict=True):
            self._count_failure(stem, ack)
        return acks

    async def _js_publish(self, subject: str, body: bytes, headers: dict[str, str], *, repeatable: bool) -> _PubAck:
        # A repeat is harmless when the message id de-duplicates it; JetStream rides out a leader election.
        ack = await self.through_failover(
            f"publish {subject}", lambda: self._js_request(subject, body, headers), repeatable=repeatable
        )
        return landed_where_expected(subject, ack)

    async def _js_request(self, subject: str, body: bytes, headers: dict[str, str] | None) -> _PubAck:
        """One JetStream publish and its PubAck (errors raised as ``pub_ack`` raises them)."""
        return pub_ack(await self._replies.request(subject, body, headers))

    async def _js_publish_many(self, items: list[tuple[str, bytes, dict[str, str], bool]]) -> list[_PubAck]:
        """``through_failover`` for a batch of (subject, body, headers, repeatable): every message is
        sent in order, the PubAcks are awaited under one timeout; a message that timed out (if
        repeatable) or found no stream leader is sent again (same headers, so the same message id)
        until ``LW_FAILOVER_RETRY_S``; any other error is raised."""
        deadline = time.monotonic() + self.settings.failover_retry_s
        delay = 0.1
        acks: list[_PubAck | None] = [None] * len(items)
        todo = list(range(len(items)))
        while True:
            sent: list[tuple[str, asyncio.Future[Msg]]] = []
            try:
                for i in todo:
                    subject, body, headers, _ = items[i]
                    sent.append(await self._replies.send(subject, body, headers))
            except BaseException:
                self._replies.forget(sent)  # nobody awaits what went out
                raise
            await self._replies.wait(sent)
            again: list[int] = []
            failure: Exception | None = None
            for i, (_, fut) in zip(todo, sent, strict=True):
                if fut.exception() is not None:  # no PubAck in time (the only exception set): ambiguous
                    failure = NatsTimeoutError()
                    if not items[i][3]:
                        raise failure
                    again.append(i)
                    continue
                try:
                    acks[i] = landed_where_expected(items[i][0], pub_ack(fut.result()))
                except (NoStreamResponseError, ServiceUnavailableError) as err:  # nothing was stored
                    failure = err
                    again.append(i)
            if failure is None:
                return [ack for ack in acks if ack is not None]
            if time.monotonic() > deadline:
                raise failure
            log.warning(
                "%s: publish %s: JetStream unavailable (%s), again",
                self.service,
                items[again[0]][0],
                describe_nats_error(failure),
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)
            todo = again
