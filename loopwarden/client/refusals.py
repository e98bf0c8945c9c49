"""A refusal reads as a refusal: the server's permissions violation as one typed error naming the user and
what it may not do (``PermissionDenied``), never a timeout or "not ready".

nats-server answers a publish or a subscription outside the user's grant with an asynchronous
``-ERR 'Permissions Violation for Publish to "<subject>"'`` (nats-py hands it to the connection's error
callback as ``nats: permissions violation for publish to "<subject>"``, the subject lower-cased) and drops
what was sent: the request it carried gets no answer, the direct get no value. ``Refusals`` hears them
(``Connection`` installs it on its connection) and ``guard`` ends the operation waiting at that moment with
``PermissionDenied`` instead of letting it wait for its timeout. The reading of a violation is pure
(``violation``, ``what_of``), so the CLI and the tests share one wording.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar

from shared import subjects as S

_T = TypeVar("_T")
_VIOLATION = re.compile(r'permissions violation for (publish|subscription) to "([^"]*)"', re.IGNORECASE)
_JS_READ = re.compile(r"^\$js\.api\.(?:direct\.get|stream\.msg\.get|stream\.info)\.([^.]+)(?:\.(.*))?$")
_CONSUMER_VERBS = {"create", "info", "msg", "next", "durable", "delete", "list", "names", "pause", "leader", "stepdown"}


class PermissionDenied(PermissionError):
    """The server refused this client's NATS user something its grant does not allow: ``user`` may not ``what``
    (``read lw_escalations``, ``ask lw.v1.rpc.runs.list.acme``, ...). One line; the CLI prints it, exit 1."""

    def __init__(self, user: str, what: str, hint: str = "") -> None:
        self.user, self.what = user, what
        super().__init__(f"user {user} may not {what}: permission denied{f' ({hint})' if hint else ''}")


@dataclass(frozen=True)
class Violation:
    """One permissions violation as the server reported it: ``publish`` or ``subscription``, and the subject."""

    kind: str
    subject: str


def violation(message: str) -> Violation | None:
    """The violation an error message reports (None: the message is not a permissions violation)."""
    found = _VIOLATION.search(message)
    return Violation(found.group(1).lower(), found.group(2)) if found else None


def what_of(v: Violation) -> str:
    """What the user tried, in the words of the docs: read a bucket or a stream, write a bucket, ask a service,
    publish a command, receive its replies, subscribe to events."""
    subject = v.subject
    if v.kind == "subscription":
        if subject.startswith("_inbox"):
            return f"receive replies on {subject.split('.', 1)[0]}"
        return f"subscribe to {subject}"
    js = _JS_READ.match(subject)
    if js is not None:
        stream, rest = js.group(1), js.group(2) or ""
        if stream.startswith("kv_"):
            return f"read {stream[3:]}"
        if stream.upper() == S.STREAM_PAYLOADS and rest.startswith(S.PAYLOAD_PREFIX + "."):
            owner = rest[len(S.PAYLOAD_PREFIX) + 1 :].split(".", 1)[0]
            return f"read the stored bodies of {owner}"
        return f"read {stream.upper()}"
    if subject.startswith("$js.api.consumer."):
        tokens = [t for t in subject.split(".")[3:] if t not in _CONSUMER_VERBS]
        return f"create or use consumers on {tokens[0].upper() if tokens else 'a stream'}"
    if subject.startswith("$kv."):
        return f"write {subject.split('.')[1]}"
    if subject.startswith(f"{S.P}.rpc."):
        return f"ask {subject}"
    return f"publish on {subject}"


class Refusals:
    """The connection's error callback for permissions violations: each one ends every ``guard`` waiting now
    (other errors go on to ``previous``, the callback the connection had)."""

    def __init__(self, user: str, inbox: str | None = None, tenant: str = S.DEFAULT_TENANT) -> None:
        self.user, self.tenant = user, tenant
        self.inbox = inbox or S.inbox_prefix(user, tenant)  # where its replies come (``Bus.inbox_prefix``)
        self.seen: list[Violation] = []  # every violation heard, oldest first (bounded)
        self._waiting: set[asyncio.Future[Violation]] = set()
        self.previous: Any = None

    async def on_error(self, err: Exception) -> None:
        found = violation(str(err))
        if found is None:
            if self.previous is not None:
                await self.previous(err)
            return
        self.seen.append(found)
        del self.seen[:-100]
        for waiter in list(self._waiting):
            if not waiter.done():
                waiter.set_result(found)

    def denied(self, v: Violation) -> PermissionDenied:
        if v.kind != "subscription" or not v.subject.startswith("_inbox"):
            return PermissionDenied(self.user, what_of(v))
        if self.tenant != S.DEFAULT_TENANT:  # a person's inbox is under its role: LW_TENANT says which
            hint = (
                f"LW_TENANT={self.tenant} makes it a client of tenant {self.tenant}, whose replies come to "
                f"{self.inbox}; an operator leaves LW_TENANT unset"
            )
        else:
            hint = f"replies to user {self.user} come to {self.inbox}: LW_NATS_USER names the user"
        return PermissionDenied(self.user, f"receive replies on {self.inbox}", hint)

    async def guard(self, work: Awaitable[_T]) -> _T:
        """``work``'s result, or ``PermissionDenied`` as soon as the server refuses something while it runs
        (``work`` is cancelled then: what it waits for will not come)."""
        refused: asyncio.Future[Violation] = asyncio.get_running_loop().create_future()
        self._waiting.add(refused)
        task: asyncio.Future[_T] = asyncio.ensure_future(work)
        either: set[asyncio.Future[Any]] = {task, refused}
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            task.cancel()
            raise
        finally:
            self._waiting.discard(refused)
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        raise self.denied(refused.result())


_P = ParamSpec("_P")
_Self = TypeVar("_Self")


def guarded(
    method: Callable[Concatenate[_Self, _P], Coroutine[Any, Any, _T]],
) -> Callable[Concatenate[_Self, _P], Coroutine[Any, Any, _T]]:
    """A client method that ends with ``PermissionDenied`` as soon as the server refuses what it does
    (``Connection.guard``)."""

    @functools.wraps(method)
    async def call(self: _Self, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        result: _T = await self.guard(method(self, *args, **kwargs))  # type: ignore[attr-defined]
        return result

    return call
