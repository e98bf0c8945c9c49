"""Finding and reaching the server, and the connection every part of the client shares (``Connection``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable
from typing import Any, Self, TypeVar

from loopwarden.client.refusals import Refusals
from loopwarden.stack import StackError, recorded_nats_url
from shared import subjects as S
from shared.bus import Bus, kv_scan, natsx
from shared.messages import (
    RunRead,
    RunReadReply,
)
from shared.settings import Settings
from shared.telemetry import Telemetry, setup_telemetry
from shared.urls import redact_url

_T = TypeVar("_T")


class Unreachable(ConnectionError):
    """The client could not connect: nothing answers at the URL, the server refused the credentials, or
    JetStream was not ready in time. The message names the URL (never a password) and where it came from."""

    def __init__(self, message: str, url: str) -> None:
        super().__init__(message)
        self.url = url  # as shown: without its password


def resolve_settings(settings: Settings | None = None) -> tuple[Settings, str]:
    """The settings pointed at a server the way the CLI finds one: the URL given (``Settings(nats_url=...)``,
    ``LW_NATS_URL``/``NATS_URL``), else the stack ``loopwarden up`` recorded, else the default; and where
    the URL came from (for errors)."""
    settings = settings if settings is not None else Settings()
    if "nats_url" in settings.model_fields_set:
        return settings, ""
    try:
        recorded = recorded_nats_url(settings.state_dir)
    except StackError as err:
        raise Unreachable(str(err), redact_url(settings.nats_url)) from None
    if recorded is None:
        return settings, " (the default: LW_NATS_URL/NATS_URL is not set and `loopwarden up` recorded no stack)"
    url, path = recorded
    return settings.model_copy(update={"nats_url": url}), f" (the stack `loopwarden up` recorded in {path})"


async def probe(settings: Settings, timeout: float, origin: str = "") -> None:
    """One bounded connect: the server answers at ``settings.nats_url`` within ``timeout`` seconds, or
    :class:`Unreachable` naming the URL (``origin``: where it came from)."""
    import nats
    from nats.errors import Error as NatsError

    servers = [u.strip() for u in settings.nats_url.split(",")]
    password = settings.nats_password.get_secret_value() if settings.nats_password else None
    seen: list[Exception] = []

    async def remember(err: Exception) -> None:
        seen.append(err)

    try:
        async with asyncio.timeout(timeout + 1):
            # nats-py drops a server from its pool only after max_reconnect_attempts (> 0) failures
            nc = await nats.connect(
                servers,
                connect_timeout=timeout,
                allow_reconnect=False,
                max_reconnect_attempts=1,
                reconnect_time_wait=0.1,
                user=settings.nats_user,
                password=password,
                error_cb=remember,
            )
    except (OSError, TimeoutError, NatsError) as err:
        last = seen[-1] if seen else err
        why = (str(last) or type(last).__name__).replace(password or "\0", "***")
        url = redact_url(settings.nats_url)
        raise Unreachable(
            f"cannot reach NATS at {url}{origin} ({why}); is the stack up? `loopwarden up` starts one, "
            "LW_NATS_URL/NATS_URL picks another",
            url,
        ) from None
    await nc.close()


READY_TIMEOUT_S = 30.0  # JetStream answers within it, or it will not (the streams are created here)
_ADMIN = "admin"  # the one user that creates streams, buckets and consumers on a locked deployment


class Connection:
    """A client's connection and what its parts share: the settings, the bus, the telemetry, the refusals
    the server reported, and the tenant-bound reads through the planner. ``Client`` is this plus its parts
    (runs, reads, waits, the queue, dead letters)."""

    def __init__(
        self,
        settings: Settings | None = None,
        telemetry: Telemetry | None = None,
        identity: str | None = None,  # the NATS user this client is: by default LW_NATS_USER (else "client")
        *,
        connect_timeout: float | None = None,
        ready_timeout: float | None = READY_TIMEOUT_S,
    ) -> None:
        settings, self._origin = resolve_settings(settings)
        # Its inbox is that user's (``_INBOX_<user>``, a person's under its role): its grant reads replies there.
        self.identity = identity or settings.nats_user or "client"
        if settings.manage_streams and settings.nats_user not in (None, _ADMIN):
            # a user of a locked deployment creates nothing (only the admin may): it waits for what it uses
            settings = settings.model_copy(update={"manage_streams": False})
        self.settings = settings
        self.connect_timeout = connect_timeout if connect_timeout is not None else self.settings.cli_connect_timeout_s
        self.ready_timeout = ready_timeout  # None: wait without limit (a client started before bootstrap)
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._run_events: dict[str, list[Any]] = {}  # run id -> subscriptions to its run events
        self._finals_seen: dict[str, str] = {}  # run id -> the final status whose event those relayed
        self.telemetry: Telemetry | None = telemetry or setup_telemetry(self.identity, self.settings)
        self.bus = Bus(self.settings, self.identity, self.telemetry.bus_tracer_provider)
        self.refusals = Refusals(self.identity, self.bus.inbox_prefix, self.settings.tenant)

    async def connect(self) -> Self:
        """Connect (bounded, see ``Client``) and wait for what this client uses: where it may create streams
        (an open stack, or the admin), they are made; else the stream it submits to (``LW_SUBMIT``, which
        every client user may look up) must exist. A permissions violation meanwhile is ``PermissionDenied``."""
        await probe(self.settings, self.connect_timeout, self._origin)
        try:
            async with asyncio.timeout(self.ready_timeout):
                nc = await self.bus.broker.connect()
                self.refusals.previous = natsx.error_callback(nc)
                natsx.set_error_callback(nc, self.refusals.on_error)
                if self.settings.manage_streams:
                    await self.guard(self.bus.connect())
                else:
                    js = self.bus.js
                    await self.guard(
                        self.bus.until_ready(f"stream {S.STREAM_SUBMIT}", lambda: js.stream_info(S.STREAM_SUBMIT))
                    )
        except TimeoutError:
            with contextlib.suppress(Exception):
                await self.bus.broker.stop()
            url = redact_url(self.settings.nats_url)
            raise Unreachable(
                f"NATS at {url}{self._origin} answered but JetStream was not ready in {self.ready_timeout:.0f}s "
                "(has `loopwarden bootstrap` run?)",
                url,
            ) from None
        except BaseException:
            with contextlib.suppress(Exception):
                await self.bus.broker.stop()
            raise
        return self

    async def guard(self, work: Awaitable[_T]) -> _T:
        """``work``'s result, or ``PermissionDenied`` (naming this user and what it may not do) as soon as the
        server refuses something meanwhile, instead of waiting for an answer that will not come."""
        return await self.refusals.guard(work)

    async def close(self) -> None:
        """Disconnect (and flush this client's spans)."""
        if self.bus.closed_for_good.is_set():  # nothing to drain: the server closed it
            with contextlib.suppress(Exception):
                await self.bus.broker.stop()
        else:
            await self.bus.broker.stop()
        if self.telemetry is not None:
            self.telemetry.tracer_provider.force_flush()

    async def __aenter__(self) -> Self:
        return await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def tenant_bound(self) -> bool:
        """A client of a tenant other than the default reads its runs through the planner (``rpc.runs``,
        its own tenant's runs only): its user may read no bucket or stream of runs, which hold every
        tenant's. The default tenant's ``client`` (a single-tenant deployment's) reads them directly."""
        return self.settings.tenant != S.DEFAULT_TENANT

    async def _read(self, verb: str, read: RunRead) -> RunReadReply:
        return await self.guard(self.bus.request(S.run_read(verb, self.settings.tenant), read, RunReadReply))

    async def _value(self, value: Any) -> bytes:
        """A value a ``RunReadReply`` carries, its body fetched when it travelled by reference."""
        return await self.bus.payloads.inflate_value(self.bus.nc, json.dumps(value).encode())

    async def _values(self, bucket: str) -> list[bytes]:
        """Every current value of a bucket, by batched direct gets (no consumer: clients may create none)."""
        await self.bus.kv(bucket)
        found, _ = await kv_scan(self.bus.nc, bucket)
        return [await self.bus.payloads.inflate_value(self.bus.nc, m.data) for m in found.values() if m and m.data]
