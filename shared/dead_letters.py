"""Dead letters as data: what a letter keeps of a message, and whether and how it can be handed back.

Pure rules, no bus: the bus writes letters with ``letter_body``, and runs a requeued one (which it reads
from LW_DLQ itself, ``not_ours``) through the consumer ``taker`` names; the client asks ``refusal`` before
it sends the requeue.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from shared import subjects as S
from shared.messages import DeadLetter, Requeue

BODY_LIMIT = 256 * 1024  # bytes of a dead-lettered body kept in its letter
_CUT = re.compile(r"\.\.\. \[(\d+) bytes, cut to (\d+)\]\Z")
REQUEUEABLE_STREAMS = (S.STREAM_CMD, S.STREAM_SUBMIT, S.STREAM_EVT)  # LW_SUBMIT: submits (and requeues)


class NoSuchLetter(LookupError):
    """No dead letter has that number."""


class NotRequeueable(ValueError):
    """The letter cannot be handed back to its service; the message says why."""


def letter_body(data: bytes) -> str:
    """The body a letter keeps: the message's text, cut (and marked) past ``BODY_LIMIT`` bytes so the
    letter itself fits under the server's payload limit."""
    body = data.decode("utf-8", errors="replace")
    if len(data) > BODY_LIMIT:
        body = body[:BODY_LIMIT] + f"... [{len(data)} bytes, cut to {BODY_LIMIT}]"
    return body


def carried_headers(headers: dict[str, str]) -> dict[str, str]:
    """The message's own headers, to travel with it when it is handed back: the run id, trace context and
    payload reference stay; ``Nats-*`` ones (its message id, the stream it was expected in) are the server's
    controls of that first publish and would refuse or de-duplicate the new one."""
    return {k: v for k, v in headers.items() if not k.lower().startswith("nats-")}


def refusal(seq: int, letter: DeadLetter) -> str | None:
    """Why letter ``seq`` cannot be handed back to its service (None: it can)."""
    stream = S.stream_for(letter.subject)
    if stream is None:
        return (
            f"letter {seq} is a request on {letter.subject} (core NATS request/reply, kept in no stream): "
            f"its caller stopped waiting when {letter.service} refused it, so there is no one to answer; "
            "the caller sends it again"
        )
    if stream not in REQUEUEABLE_STREAMS:
        return f"letter {seq} came from {letter.subject} ({stream}): only commands and events are handed back"
    if S.matches(f"{S.REQUEUE_PREFIX}.>", letter.subject):
        return (
            f"letter {seq} is a requeue that {letter.service} could not read ({letter.reason}); "
            "requeue the letter it was made from"
        )
    cut = _CUT.search(letter.body)
    if cut is not None and len(letter.body.encode()) > BODY_LIMIT:
        return (
            f"letter {seq} kept only the first {cut.group(2)} of the message's {cut.group(1)} bytes; "
            "it cannot be handed back whole"
        )
    own = S.requeue(letter.service)
    if letter.requeue_to is None or not (letter.requeue_to == own or letter.requeue_to.startswith(f"{own}.")):
        return (
            f"letter {seq} names no consumer of {letter.service} to hand it back to (requeue_to: {letter.requeue_to})"
        )
    return None


def superseded(seq: int, later: Iterable[tuple[int, DeadLetter]]) -> str | None:
    """Why letter ``seq`` is not the one to hand back: it was requeued and failed again as a later letter
    (handing back both would run the message twice at once), or None."""
    again = [n for n, letter in later if letter.requeued_from == seq]
    if again:
        return f"letter {seq} was handed back and failed again as letter {again[-1]}: requeue letter {again[-1]}"
    return None


def not_ours(seq: int, stored_on: str, letter: DeadLetter, service: str) -> str | None:
    """Why ``service`` will not run letter ``seq`` (stored on subject ``stored_on``) when asked to, or None.
    Only ``service`` may publish on its own dead-letter subject (the server's permissions), so a letter
    stored there is one it gave up on itself; anything else could be a message someone wrote to make it
    run, or another service's letter."""
    if stored_on != S.dead_letter(service) or letter.service != service:
        return f"letter {seq} was dead-lettered by {letter.service} (on {stored_on}), not by {service}"
    return refusal(seq, letter)


def requeue_command(seq: int) -> Requeue:
    """The command that hands letter ``seq`` back to its service (check ``refusal`` first)."""
    return Requeue(letter=seq)


def requeue_msg_id(seq: int) -> str:
    """A requeue's message id: unpredictable (``requeue-<letter>-<random>``). Clients publish their submits on
    the same stream (``LW_SUBMIT``), which de-duplicates by message id, so an id a client could guess is one it
    could send first and make the operator's requeue a silent duplicate (security review 4, N4). A letter is
    still taken back once: its service claims ``lw_requeues/<service>.<letter>``, which the operator's CLI
    reads before sending."""
    import secrets

    return f"requeue-{seq}-{secrets.token_hex(16)}"


def taker(consumers: Iterable[tuple[str, tuple[str, ...]]], subject: str) -> str | None:
    """Of a service's (durable, filter subjects), the one that takes ``subject`` (a service's durables
    never overlap: a message two of them took would be handled twice), or None."""
    for durable, filters in consumers:
        if any(S.matches(f, subject) for f in filters):
            return durable
    return None
