"""Requeue: a dead letter handed back (``Requeue`` on ``requeue_<service>``) runs once more through
the service's consumer that takes its subject, as a redelivery; a letter is handed back once."""

from __future__ import annotations

import dataclasses
import logging

from nats.aio.msg import Msg
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import (
    BadRequestError,
    NoStreamResponseError,
    ServiceUnavailableError,
)
from opentelemetry.trace import SpanKind
from pydantic import BaseModel

from shared import ids
from shared import subjects as S
from shared.bus.consuming import Consuming
from shared.bus.errors import Undecodable, describe_nats_error
from shared.bus.kv import Buckets
from shared.bus.pulls import _Pull
from shared.bus.wire import RUN_ID_HEADER, _stream_seq, num_delivered
from shared.dead_letters import NoSuchLetter, NotRequeueable, carried_headers, not_ours, run_of, taker
from shared.messages import DeadLetter, LetterHandled, Requeue

log = logging.getLogger("loopwarden.bus")


class RequeueClaim(BaseModel):
    """``lw_requeues/<service>.<letter>``: the requeue command that took the letter back (once)."""

    letter: int
    requeue_seq: int


class Requeueing(Consuming, Buckets):
    async def _requeue(self, msg: Msg) -> None:
        """A dead letter handed back (``Requeue`` on ``requeue_<service>``): run it through this service's
        consumer that takes its subject, as a redelivery, and ack or hand back ``msg`` as that consumer
        would have. It fails as any delivery does: tried again in place while a dependency is not ready,
        then dead-lettered again with its reason, naming the letter it was requeued from."""
        deliveries = num_delivered(msg.reply)
        limit = self.settings.max_deliver

        async def refuse(why: str) -> None:
            await self.dead_letter(msg, f"not requeued: {why}", deliveries)
            await msg.ack()

        if deliveries > limit:  # it crashed this process (or hung) on every delivery
            await refuse(f"not completed after {deliveries - 1} deliveries (the handler crashed or hung)")
            return
        try:
            cmd = await self._decode(Requeue, msg)
            # The letter as this service stored it, not anything the requester sent: a requeue hands back
            # what this service gave up on and can make it run nothing else.
            stored_on, letter = await self.read_letter(cmd.letter)
            why = not_ours(cmd.letter, stored_on, letter, self.service)
            if why is None:  # once per letter, whatever message ids the requesters used
                why = await self._take_back_once(cmd.letter, _stream_seq(msg))
        except (Undecodable, NoSuchLetter, NotRequeueable) as err:
            why = str(err)
        except BadRequestError as err:  # e.g. a number JetStream cannot read (>= 2^64): no such letter
            why = f"letter {str(cmd.letter)[:40]} cannot be read: {describe_nats_error(err)}"
        except (
            NatsTimeoutError,
            TimeoutError,
            NoRespondersError,
            NoStreamResponseError,
            ServiceUnavailableError,
        ) as err:
            if deliveries >= limit:  # the letter could not be read through every delivery
                await refuse(f"the letter could not be read after {deliveries} deliveries: {err!r}")
            else:  # JetStream not answering (a leader election, a restart): the requeue waits, it is not lost
                log.warning("%s: requeue handed back, the letter could not be read: %r", self.service, err)
                await msg.nak(delay=self.settings.redeliver_delay_s * 2 ** (deliveries - 1))
            return
        if why is not None:
            await refuse(why)
            return
        run_id = letter.headers.get(RUN_ID_HEADER)
        if run_id:  # behind the run's other messages in this replica, as its consumer would have it
            await self._run_locks.acquire(run_id)
        try:
            await self._requeued(msg, cmd.letter, letter, deliveries)
        finally:
            if run_id:
                self._run_locks.release(run_id)

    async def _take_back_once(self, letter: int, requeue_seq: int) -> str | None:
        """Claim letter ``letter`` for the requeue command stored at ``requeue_seq`` (``lw_requeues``,
        ``<service>.<letter>``, created with compare-and-swap): None if it is this command's (the first,
        or this command delivered again), else why not - it was handed back already."""
        claim = RequeueClaim(letter=letter, requeue_seq=requeue_seq)
        stored, _, created = await self.create_or_get(S.KV_REQUEUES, S.kv_key(self.service, str(letter)), claim)
        if created or stored.requeue_seq == requeue_seq:
            return None
        return f"letter {letter} was handed back already (requeue #{stored.requeue_seq}); a letter is requeued once"

    async def _requeued(self, msg: Msg, seq: int, letter: DeadLetter, deliveries: int) -> None:
        """Run letter ``seq`` (read and checked by ``_requeue``) through the consumer that takes it."""
        headers = carried_headers(letter.headers)
        # The message as it first arrived (subject, body, headers), acknowledged through the requeue's own
        # ack subject: in-progress, ack, nak and the delivery count are this requeue's.
        original = dataclasses.replace(msg, subject=letter.subject, data=letter.body.encode(), headers=headers)
        takers = [p for p in self._pulls if type(p) is _Pull]  # not the requeue durable itself
        durable = taker(((p.spec.durable, p.spec.filter_subjects) for p in takers), letter.subject)
        pull = next((p for p in takers if p.spec.durable == durable), None)
        if pull is None:  # another replica may consume it (an executor hosting other tools)
            reason = f"no consumer of {self.service} here takes {letter.subject}"
            if deliveries >= self.settings.max_deliver:
                await self.dead_letter(original, reason, letter.deliveries + deliveries, requeued_from=seq)
                await msg.ack()
            else:
                log.warning("%s: letter %d handed back: %s", self.service, seq, reason)
                await msg.nak(delay=self.settings.redeliver_delay_s)
            return
        log.info("%s: letter %d requeued on %s (%s)", self.service, seq, pull.spec.durable, letter.subject)
        earlier = letter.deliveries
        deliver = self._deliver(original, pull.model, pull.handler, earlier=earlier, requeued_from=seq)
        if self._tracer is None or "traceparent" not in headers:
            handled = await deliver
        else:
            # Processed in the trace the message belonged to (the run's), whoever requeued it and whether or
            # not they traced: what the handler does now continues the run's trace.
            with self._span(f"{S.stem(letter.subject)} process", SpanKind.CONSUMER, self._extract(headers), headers):
                handled = await deliver
        if handled:  # the run it held up (stalled on it) moves on: the planner hears it
            run_id = run_of(letter)
            done = LetterHandled(letter=seq, service=self.service, subject=letter.subject[:512], run_id=run_id)
            try:
                await self.publish(S.LETTER_HANDLED, done, msg_id=ids.letter_handled(self.service, seq), run_id=run_id)
            except Exception as err:  # the letter is handled; the run says stalled until a step of it moves
                log.error("%s: letter %d handled, but not said so: %r", self.service, seq, err)
