"""Tenants and operators as configuration: the access file an admin writes (pure: no bus).

One YAML file declares every tenant (its NATS client users and its policy: ``shared.tenancy.TenantPolicy``)
and every operator (the queue kinds it may act on, what it may do to agents, its NATS and console password
hashes)::

    tenants:
      acme:
        users:
          client_acme: {password_hash: "$2b$12$..."}   # bcrypt; left out: $LW_NATS_PASSWORD_CLIENT_ACME
        policy: {weight: 2, max_running: 20, daily_ceiling_usd: 25}
    operators:
      alice: {kinds: ["*"], agents: all, password_hash: "$2b$...", console_password_hash: "$2b$..."}
      bob: {kinds: [not_judged, approval, spawn]}
    services:                                           # optional: the built-in users' password hashes
      planner: {password_hash: "$2b$..."}

``loopwarden config apply FILE --auth-conf PATH`` renders ``auth.conf`` from it (``shared/permissions.py``)
and stores what the services read live in ``lw_config`` (``shared/messages/config.py``). Adding a tenant or
an operator changes no service's grant (the people's inboxes and stored bodies are under wildcards the
services' grants name once), so it is a reload of nats-server, not a restart; so is rotating a password
whose hash is in the file. ``schemas/access.json`` is the file's JSON Schema; ``deploy/access.yaml`` the
example the shipped ``deploy/nats/auth.conf`` is generated from.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from shared import subjects as S
from shared.canonical import digest_of
from shared.describe import problems
from shared.messages.config import AccessRecord, AgentRight, ConsoleUsers, OperatorEntry
from shared.messages.wire import Name, Wire
from shared.tenancy import TenantPolicy

MAX_ACCESS_FILE_BYTES = 1_000_000
# Names a person's user may not take: the built-in users, the first token of the people's inboxes and
# bodies (a user named ``tenant`` would own ``lw.v1.payload.tenant.>``, every tenant's bodies), and the
# queue's own actors.
RESERVED_USERS = frozenset((*S.BUILT_IN_USERS, S.TENANT_ROLE, S.OPERATOR_ROLE, "sla", "anonymous"))
BCRYPT = re.compile(r"^\$2[abxy]?\$\d\d\$[./A-Za-z0-9]{53}$")


class AccessError(ValueError):
    """An access file that cannot be used: one line (or one line per problem), naming the file and the field."""


def _bcrypt(v: str | None) -> str | None:
    if v is not None and not BCRYPT.match(v):
        raise ValueError("not a bcrypt hash ($2b$<cost>$...; `loopwarden config hash` makes one)")
    return v


class UserEntry(Wire):
    """A NATS user: its password as a bcrypt hash (left out: ``$LW_NATS_PASSWORD_<USER>`` in the server's
    environment, which a reload cannot change: only a hash in the file is rotated by a reload)."""

    password_hash: str | None = Field(None, description="bcrypt hash of the NATS password")

    _password_hash = field_validator("password_hash")(lambda cls, v: _bcrypt(v))


class TenantEntry(Wire):
    users: dict[Name, UserEntry] = Field(
        default_factory=dict, description="its NATS client users: each submits and reads this tenant's runs only"
    )
    policy: TenantPolicy = Field(default_factory=TenantPolicy, description="its share and quotas over the defaults")

    @field_validator("users", mode="before")
    @classmethod
    def _empty_entries(cls, v: Any) -> Any:
        return {name: entry or {} for name, entry in v.items()} if isinstance(v, dict) else v


class OperatorFileEntry(OperatorEntry, UserEntry):
    """An operator: the roster's kinds and agent right, its NATS password hash, its console login's hash."""

    console_password_hash: str | None = Field(None, description="bcrypt hash of its console password (none: no login)")

    _console_password_hash = field_validator("console_password_hash")(lambda cls, v: _bcrypt(v))


class AccessFile(Wire):
    """The whole file. Unknown keys are refused (a typo must not silently drop a right)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    tenants: dict[Name, TenantEntry] = Field(default_factory=dict)
    operators: dict[Name, OperatorFileEntry] = Field(default_factory=dict)
    services: dict[Name, UserEntry] = Field(default_factory=dict, description="built-in users' password hashes")

    @field_validator("tenants", "operators", "services", mode="before")
    @classmethod
    def _none_is_empty(cls, v: Any) -> Any:
        if v is None:
            return {}
        return {name: entry or {} for name, entry in v.items()} if isinstance(v, dict) else v

    @model_validator(mode="after")
    def _names(self) -> AccessFile:
        seen: dict[str, str] = {}

        def claim(user: str, where: str) -> None:
            if user in RESERVED_USERS:
                raise ValueError(f"{where}: {user!r} is a built-in or reserved name")
            if user in seen:
                raise ValueError(f"{where}: user {user!r} is declared twice (also {seen[user]})")
            seen[user] = where

        for tenant, entry in self.tenants.items():
            if tenant == S.DEFAULT_TENANT and entry.users:
                raise ValueError(
                    f"tenants.{tenant}.users: the default tenant's client is the built-in `client` user; "
                    "give its clients a tenant of their own"
                )
            for user in entry.users:
                claim(user, f"tenants.{tenant}.users.{user}")
        for name in self.operators:
            claim(name, f"operators.{name}")
        for name in self.services:
            if name not in S.BUILT_IN_USERS:
                raise ValueError(f"services.{name}: not a built-in user ({', '.join(S.BUILT_IN_USERS)})")
        return self

    # --- what is derived from it ---------------------------------------------------------------------
    def tenant_users(self) -> dict[str, str]:
        """NATS user -> the tenant it is bound to."""
        return {user: tenant for tenant, entry in self.tenants.items() for user in entry.users}

    def roster(self) -> dict[str, list[str]]:
        """``LW_OPERATORS``: operator -> the kinds it may act on."""
        return {name: list(entry.kinds) for name, entry in self.operators.items()}

    def agent_rights(self) -> dict[str, AgentRight]:
        return {name: entry.agents for name, entry in self.operators.items()}

    def console_users(self) -> dict[str, str]:
        """``LW_CONSOLE_USERS``: operator -> bcrypt hash, for the operators with a console login."""
        return {n: e.console_password_hash for n, e in self.operators.items() if e.console_password_hash}

    def password_hashes(self) -> dict[str, str]:
        """NATS user -> the bcrypt hash the file gives it (the others' come from the server's environment)."""
        found = {u: e.password_hash for t in self.tenants.values() for u, e in t.users.items() if e.password_hash}
        found |= {n: e.password_hash for n, e in self.operators.items() if e.password_hash}
        return found | {n: e.password_hash for n, e in self.services.items() if e.password_hash}

    def digest(self) -> str:
        return digest_of(self.model_dump(mode="json", exclude_none=True))

    def record(self, applied_by: str = "") -> AccessRecord:
        """``lw_config/access``: what the planner, the governor, the escalation service and the console read."""
        return AccessRecord(
            tenants={t: e.policy for t, e in self.tenants.items()},
            tenant_users=self.tenant_users(),
            operators={n: OperatorEntry(kinds=e.kinds, agents=e.agents) for n, e in self.operators.items()},
            digest=self.digest(),
            applied_by=applied_by[:64],
        )

    def console_record(self) -> ConsoleUsers:
        users = self.console_users()
        return ConsoleUsers(users=users, digest=digest_of(users))


def parse_access(data: Any, source: str = "<access>") -> AccessFile:
    if not isinstance(data, dict):
        raise AccessError(f"{source}: an access file is a mapping with tenants, operators and services")
    try:
        return AccessFile.model_validate(data)
    except ValidationError as err:
        found = [line.replace("Value error, ", "") for line in problems(err, empty="(file)")]
        raise AccessError(f"{source}: invalid access file:\n  " + "\n  ".join(found)) from None


def load_access(path: str | Path) -> AccessFile:
    """The access file at ``path`` (YAML or JSON), or :class:`AccessError` naming the file and what is wrong."""
    p = Path(path)
    try:
        if p.stat().st_size > MAX_ACCESS_FILE_BYTES:
            raise AccessError(f"{p}: an access file may have at most {MAX_ACCESS_FILE_BYTES} bytes")
        text = p.read_bytes().decode("utf-8")
    except OSError as err:
        raise AccessError(f"{p}: cannot read the access file: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise AccessError(f"{p}: not UTF-8 text (byte {err.start})") from None
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError, RecursionError) as err:
        what = "JSON" if p.suffix == ".json" else "YAML"
        detail = "nested too deeply" if isinstance(err, RecursionError) else " ".join(str(err).split())
        raise AccessError(f"{p}: not valid {what}: {detail}") from None
    return parse_access(data, str(p))


# The example every checkout ships (``deploy/access.yaml`` is the same, commented; a test keeps them equal):
# the shipped ``deploy/nats/auth.conf``, the compose and Kubernetes rosters and the locked test stacks use it.
EXAMPLE = AccessFile.model_validate(
    {
        "tenants": {"acme": {"users": {"client_acme": {}}}},
        "operators": {
            "alice": {"kinds": ["*"], "agents": "all"},
            "bob": {"kinds": ["not_judged", "approval", "spawn"], "agents": "own"},
        },
    }
)
