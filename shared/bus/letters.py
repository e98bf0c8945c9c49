"""Dead letters: what a service gave up on, stored with its reason in ``LW_DLQ``, and read back."""

from __future__ import annotations

import logging
from typing import Any

from nats.js.errors import NotFoundError
from pydantic import ValidationError

from shared import ids
from shared import subjects as S
from shared.bus.publishing import Publishing
from shared.bus.wire import _stream_seq, ack_consumer
from shared.dead_letters import NoSuchLetter, NotRequeueable, letter_body, run_of
from shared.describe import describe
from shared.messages import DeadLetter
from shared.payloads import PayloadError

log = logging.getLogger("loopwarden.bus")


class Letters(Publishing):
    async def read_letter(self, seq: int) -> tuple[str, DeadLetter]:
        """Dead letter number ``seq`` and the subject it is stored on (``NoSuchLetter``; ``NotRequeueable``
        when what is stored there does not read as a letter)."""
        js = self.js
        try:
            raw = await self.through_failover(
                f"read letter {seq}", lambda: js.get_msg(S.STREAM_DLQ, seq), repeatable=True
            )
        except NotFoundError:
            raise NoSuchLetter(f"no dead letter numbered {seq} in {S.STREAM_DLQ}") from None
        try:
            data = await self.payloads.inflate(self.nc, raw.data or b"", raw.headers)
        except PayloadError as err:
            raise NotRequeueable(f"letter {seq} travelled by reference and cannot be read: {err}") from None
        try:
            return raw.subject or "", DeadLetter.model_validate_json(data)
        except ValidationError as err:
            raise NotRequeueable(f"letter {seq} does not read as a DeadLetter: {describe(err)}") from None

    async def dead_letter(self, raw: Any, reason: str, deliveries: int, *, requeued_from: int | None = None) -> None:
        consumer = ack_consumer(getattr(raw, "reply", None))
        letter = DeadLetter(
            service=self.service,
            subject=S.as_sent(raw.subject),  # a submit as its client sent it, not under its partition of the door
            reason=reason,
            body=letter_body(raw.data),
            headers={k: str(v) for k, v in (raw.headers or {}).items()},
            deliveries=deliveries,
            requeued_from=requeued_from,
            requeue_to=self._requeue_to.get(consumer) if consumer else None,
        )
        seq = _stream_seq(raw)  # a core NATS request has no JetStream metadata
        msg_id = ids.dead_letter(self.service, raw.subject, seq, requeued_from)
        # with the run it holds up as its run (``Lw-Run-Id``): the planner, which marks that run stalled, takes
        # the letter in turn with the run's other messages
        await self.publish(S.dead_letter(self.service), letter, msg_id=msg_id, run_id=run_of(letter))
        if self.bus_metrics is not None:
            self.bus_metrics.dead_lettered(raw.subject)
        log.error("%s: dead-lettered %s: %s", self.service, letter.subject, reason)
