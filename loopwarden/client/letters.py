"""Dead letters: listing them with their numbers, and handing one back to the service that gave up on it."""

from __future__ import annotations

from dataclasses import dataclass

from loopwarden.client.reads import Reads
from loopwarden.client.refusals import guarded
from shared import subjects as S
from shared.bus import RUN_ID_HEADER
from shared.bus.requeue import RequeueClaim
from shared.dead_letters import NotRequeueable, not_ours, requeue_command, requeue_msg_id, superseded
from shared.messages import (
    DeadLetter,
)


@dataclass(frozen=True)
class NumberedLetter:
    """A dead letter and its number: its sequence in LW_DLQ, which ``Client.requeue`` takes."""

    seq: int
    letter: DeadLetter


@dataclass(frozen=True)
class Requeued:
    """A letter handed back to its service."""

    seq: int
    service: str
    subject: str
    duplicate: bool = False  # never True: a requeue the server took for a duplicate raises ``NotRequeueable``


class Letters(Reads):
    """The dead letters (LW_DLQ) and their requeue."""

    async def dead_letters(self) -> list[DeadLetter]:
        return [n.letter for n in await self.letters()]

    @guarded
    async def letters(self) -> list[NumberedLetter]:
        """Every dead letter with its number, oldest first."""
        events = await self.events(subjects=f"{S.DLQ_PREFIX}.>")
        return [NumberedLetter(e.seq, DeadLetter.model_validate(e.payload)) for e in events]

    @guarded
    async def requeueable(self, seq: int) -> DeadLetter:
        """Dead letter ``seq`` if it can be handed back; else ``NoSuchLetter``, or ``NotRequeueable`` naming
        why (a request/reply letter: its caller is gone; a letter that failed again as a later one)."""
        stored_on, letter = await self.bus.read_letter(seq)
        why = not_ours(seq, stored_on, letter, letter.service) or superseded(
            seq, [(n.seq, n.letter) for n in await self.letters() if n.seq > seq]
        )
        if why is not None:
            raise NotRequeueable(why)
        claim = await self.taken_back(seq, letter.service)
        if claim is not None:
            raise NotRequeueable(
                f"letter {seq} was handed back to {letter.service} already (requeue #{claim.requeue_seq}); "
                "a letter is requeued once: nothing was sent"
            )
        return letter

    async def taken_back(self, seq: int, service: str) -> RequeueClaim | None:
        """The requeue that took letter ``seq`` back to ``service`` (``lw_requeues``), or None."""
        claim, _ = await self.bus.kv_get(S.KV_REQUEUES, S.kv_key(service, str(seq)), RequeueClaim)
        return claim

    @guarded
    async def requeue(self, seq: int, letter: DeadLetter | None = None) -> Requeued:
        """Hand dead letter ``seq`` back to the service that gave up on it: that service runs it through
        the consumer that takes its subject, as a redelivery (its handlers are idempotent), and nothing is
        published on the message's own subject again (an event stays once in the runs' history). A second
        requeue of a letter its service took back already is refused here (``NotRequeueable``), and the service
        refuses it too. A PubAck saying "duplicate" means this requeue was not stored (another message holds its
        id): ``NotRequeueable`` saying so, never "handed back before".
        ``letter``: what ``requeueable(seq)`` returned (else it is asked here)."""
        if letter is None:
            letter = await self.requeueable(seq)
        assert letter.requeue_to is not None  # ``refusal`` refuses a letter without one
        msg_id = requeue_msg_id(seq)
        ack = await self.bus.publish(
            letter.requeue_to,
            requeue_command(seq),
            msg_id=msg_id,
            run_id=letter.headers.get(RUN_ID_HEADER),
            traceparent=letter.headers.get("traceparent"),
        )
        if ack.duplicate:
            raise NotRequeueable(
                f"letter {seq}: not sent - the server holds another message with this requeue's id "
                f"({msg_id}) and stored nothing; `loopwarden dlq` shows whether the letter was taken back"
            )
        return Requeued(seq, letter.service, letter.subject)
