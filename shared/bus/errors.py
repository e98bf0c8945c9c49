"""What the bus raises: typed failures a caller can act on, each with a one-line reason."""

from __future__ import annotations

from nats.js.errors import APIError


class TryLater(Exception):
    """Raised by a handler whose dependency is not ready: try again after ``delay``, in place (the
    message held) while the ack wait lasts; ``in_place=False`` hands the message back at once, for a
    wait that must not hold one of the consumer's slots (one tool's missing contract would otherwise
    stall every other tool's results). ``while_alive``: what is waited for is another replica that shows
    it is alive (a lease it keeps renewing), so the message is held past the ack wait, spending no
    delivery, for as long as the handler keeps saying so."""

    def __init__(self, reason: str, delay: float = 0.5, *, in_place: bool = True, while_alive: bool = False) -> None:
        super().__init__(reason)
        self.delay = delay
        self.in_place = in_place
        self.while_alive = while_alive


class CasConflict(Exception):
    """The key changed since it was read; reload and apply again."""


class StreamFull(APIError):
    """JetStream refused a publish because its stream is at its message or byte bound (``discard: new``): nothing
    was stored (``description``: ``maximum messages exceeded`` or ``maximum bytes exceeded``)."""


STREAM_FULL = 10077  # err_code of a publish to a stream at its bound with discard: new


class RequestRefused(Exception):
    """The service answered a request with an ``ErrorReply`` (the request was dead-lettered)."""


class Undecodable(Exception):
    """A message body that does not decode into its contract (the reason names why)."""


class InfrastructureNotReady(RuntimeError):
    """A stream, bucket or consumer this process needs is still missing after ``LW_INFRA_WAIT_S``."""


class SubjectTooLong(ValueError):
    """A subject (or KV key) longer than ``MAX_SUBJECT``: never sent."""


def describe_nats_error(err: BaseException) -> str:
    if isinstance(err, APIError):
        return f"{err.description or type(err).__name__} (code {err.code}, err_code {err.err_code})"
    return repr(err) if str(err) else type(err).__name__
