"""The access file an admin applied (``loopwarden config apply``), read live from ``lw_config``.

The escalation service's roster, the console's logins and roster, and the tenants' policies come from here,
at most ``LW_CONFIG_REFRESH_S`` old: applying a file changes them in every replica without a restart. Where no
file was applied (the bucket or the key is not there), each falls back to its setting (``LW_OPERATORS``,
``LW_CONSOLE_USERS``, ``LW_TENANTS``). A read that fails for another reason (JetStream not answering, a value
that does not parse) keeps the last value read; with none yet, it raises :class:`ConfigUnreadable`, so a
decision that needs the roster is refused rather than taken on a guess (no roster would let anyone act).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING, Any, TypeVar

from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NotFoundError
from pydantic import BaseModel, ValidationError

from shared import subjects as S
from shared.describe import describe
from shared.messages import AccessRecord, AgentRight, ConsoleUsers
from shared.tenancy import TenantPolicy

if TYPE_CHECKING:
    from shared.access import AccessFile
    from shared.bus import Bus

log = logging.getLogger("loopwarden.config")
M = TypeVar("M", bound=BaseModel)
_MISSING = object()


class ConfigUnreadable(RuntimeError):
    """``lw_config`` could not be read and nothing was read from it before."""


class LiveConfig:
    """One process's view of ``lw_config`` (a value is read again once it is ``LW_CONFIG_REFRESH_S`` old). The
    callers that find a value old while it is being read again wait for that read: one read per refresh, not one
    per caller (a burst of submits asks for the tenants' policies dozens of times at once)."""

    def __init__(self, bus: Bus, refresh_s: float | None = None) -> None:
        self.bus = bus
        self.refresh_s = bus.settings.config_refresh_s if refresh_s is None else refresh_s
        self._cache: dict[str, tuple[float, object]] = {}
        self._reading: dict[tuple[str, type[BaseModel]], asyncio.Future[Any]] = {}  # (value, revision)
        self.reads = 0  # reads of lw_config made (the tests count them)
        self._policies: tuple[AccessRecord, dict[str, TenantPolicy]] | None = None
        self._no_policies: dict[str, TenantPolicy] = {}

    async def _get(self, key: str, model: type[M]) -> M | None:
        """The stored value, by one read shared with every caller that asks while it is under way."""
        reading = self._reading.get((key, model))
        if reading is None:
            self.reads += 1
            reading = asyncio.ensure_future(self.bus.kv_get(S.KV_CONFIG, key, model))
            self._reading[(key, model)] = reading
            reading.add_done_callback(lambda done: self._read_done((key, model), done))
        value, _ = await asyncio.shield(reading)
        return value if isinstance(value, model) else None

    def _read_done(self, at: tuple[str, type[BaseModel]], done: asyncio.Future[Any]) -> None:
        self._reading.pop(at, None)
        if not done.cancelled():
            done.exception()  # each waiter has it raised; retrieved here for when none is left

    async def _read(self, key: str, model: type[M]) -> M | None:
        now = time.monotonic()
        cached = self._cache.get(key)
        if cached is not None and now - cached[0] < self.refresh_s:
            return cached[1] if isinstance(cached[1], model) else None
        try:
            value = await self._get(key, model)
        except (BucketNotFoundError, KeyNotFoundError, NotFoundError):
            value = None  # no access file applied: the settings say
        except Exception as err:  # JetStream not answering, a value that does not parse
            why = describe(err) if isinstance(err, ValidationError) else repr(err)
            if cached is None:
                raise ConfigUnreadable(f"{S.KV_CONFIG}/{key} cannot be read: {why}") from None
            log.warning(
                "%s: %s/%s not read again (%s); acting on the value read before",
                self.bus.service,
                S.KV_CONFIG,
                key,
                why,
            )
            self._cache[key] = (now, cached[1])
            return cached[1] if isinstance(cached[1], model) else None
        self._cache[key] = (now, value if value is not None else _MISSING)
        return value

    async def access(self) -> AccessRecord | None:
        """The applied tenants and operators (None: no file applied)."""
        return await self._read(S.CONFIG_ACCESS, AccessRecord)

    async def roster(self) -> dict[str, list[str]] | None:
        """Operator -> the queue kinds it may act on: the applied file's, else ``LW_OPERATORS`` (None: no
        roster at all, every operator may act on every kind)."""
        applied = await self.access()
        if applied is not None:
            return applied.roster()
        configured = self.bus.settings.operators
        return json.loads(configured) if configured else None

    async def agent_right(self, operator: str) -> AgentRight:
        """What ``operator`` may do to agents: the applied file's; without one, every operator on the roster
        (``LW_OPERATORS``; everyone when there is none) may register and replace any agent, as before."""
        applied = await self.access()
        if applied is not None:
            entry = applied.operators.get(operator)
            return entry.agents if entry is not None else "none"
        roster = await self.roster()
        return "all" if roster is None or operator in roster else "none"

    async def console_users(self) -> dict[str, str] | None:
        """Operator -> bcrypt hash of its console password: the applied file's (None: not applied, the console
        keeps ``LW_CONSOLE_USERS``)."""
        stored = await self._read(S.CONFIG_CONSOLE, ConsoleUsers)
        return dict(stored.users) if stored is not None else None

    async def policies(self) -> dict[str, TenantPolicy]:
        """Tenant -> its policy as applied (empty: none applied; ``Settings.tenant_policy`` adds ``LW_TENANTS``
        and the defaults under it)."""
        applied = await self.access()
        if applied is None:
            return self._no_policies  # one map, so a reader can tell nothing changed by its identity
        if self._policies is None or self._policies[0] is not applied:  # the same map while the record is the same
            self._policies = (applied, dict(applied.tenants))
        return self._policies[1]


async def configured_policies(bus: Bus) -> dict[str, TenantPolicy]:
    """The tenants' policies an admin applied (``Settings.tenant_policy(tenant, configured)`` takes them),
    read once. A service asking per submit keeps a :class:`LiveConfig` instead (one read per refresh)."""
    return await LiveConfig(bus, refresh_s=0).policies()


async def store_access(bus: Bus, access: AccessFile, applied_by: str) -> None:
    """Store an access file in ``lw_config`` (the admin's write: ``loopwarden config apply``, ``up --locked``)."""
    await bus.kv_put(S.KV_CONFIG, S.CONFIG_ACCESS, access.record(applied_by))
    await bus.kv_put(S.KV_CONFIG, S.CONFIG_CONSOLE, access.console_record())
