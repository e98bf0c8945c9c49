"""Dead letters as data: what a letter keeps of a message, and whether and how it can be handed back.

Pure rules, no bus: the bus writes letters with ``letter_body``, and runs a requeued one (which it reads
from LW_DLQ itself, ``not_ours``) through the consumer ``taker`` names; the client asks ``refusal`` before
it sends the requeue.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from shared import subjects as S
from shared.messages import RUN_ID_PATTERN, DeadLetter, Requeue

BODY_LIMIT = 256 * 1024  # bytes of a dead-lettered body kept in its letter
_CUT = re.compile(r"\.\.\. \[(\d+) bytes, cut to (\d+)\]\Z")
REQUEUEABLE_STREAMS = (S.STREAM_CMD, S.STREAM_SUBMIT, S.STREAM_EVT)  # LW_SUBMIT: submits (and requeues)


RUN_HEADER = "Lw-Run-Id"  # shared.bus.RUN_ID_HEADER (the bus imports this module, not the other way round)
_RUN_ID = re.compile(RUN_ID_PATTERN)
# Where only a service publishes (the server's grants): a letter of such a message names its run truly. What a
# person may publish (submits, requeues: LW_SUBMIT) carries whatever run id its sender wrote.
SERVICE_STREAMS = (S.STREAM_CMD, S.STREAM_EVT)


class NoSuchLetter(LookupError):
    """No dead letter has that number."""


class NotRequeueable(ValueError):
    """The letter cannot be handed back to its service; the message says why."""


_RUN_FIELD = re.compile(r'"run_id"\s*:\s*"([A-Za-z0-9_-]{1,64})"')


def letter_json(letter: DeadLetter) -> dict[str, Any]:
    """The letter's body as a JSON object ({} when it is not one: malformed, cut, nested past reading)."""
    try:
        data = json.loads(letter.body)
    except (ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def _run_id(value: object) -> str | None:
    return value if isinstance(value, str) and _RUN_ID.match(value) else None


def run_of(letter: DeadLetter) -> str | None:
    """The run whose progress a letter holds up, or None: the message's run (its header, else its body's
    ``run_id``); for a sub-agent run that never started (``cmd.run.spawn``), the parent waiting for it. Only
    for messages a service published (``SERVICE_STREAMS``): anything else names the run its sender chose."""
    if S.stream_for(letter.subject) not in SERVICE_STREAMS:
        return None
    if S.matches(S.RUN_SPAWN, letter.subject):
        return _run_id(letter_json(letter).get("parent_run_id"))
    return _run_id(letter.headers.get(RUN_HEADER)) or _run_id(letter_json(letter).get("run_id"))


def submitted_run(letter: DeadLetter) -> tuple[str, str] | None:
    """(run id, tenant) of a submit the bus or the planner refused (``cmd.run.submit.<tenant>``): the run id
    its body names (its header when the body is a reference or unreadable), the tenant the server let its
    sender publish for; None for any other letter or an id that is not one. ``LW_SUBMIT`` stores a submit under
    its partition of the door (``S.SUBMIT_TRANSFORM``): the letter's subject is read as its client sent it."""
    subject = S.as_sent(letter.subject)  # a letter of a release that kept the partition
    if not (
        S.matches(f"{S.RUN_SUBMIT_PREFIX}.*", subject) or S.matches(f"{S.RUN_SUBMIT_PREFIX}.*.{S.REPLAY}", subject)
    ):
        return None  # a submit (``cmd.run.submit.<tenant>``) or an operator's replay (``...<tenant>.replay``)
    run_id = _run_id(letter_json(letter).get("run_id")) or _run_id(letter.headers.get(RUN_HEADER))
    if run_id is None:  # a body that is not JSON (or is cut) may still name it
        found = _RUN_FIELD.search(letter.body[:4096])
        run_id = found.group(1) if found else None
    tenant = subject[len(S.RUN_SUBMIT_PREFIX) + 1 :].split(".", 1)[0]
    return (run_id, tenant) if run_id else None


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
