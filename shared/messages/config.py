"""What an admin applied (``loopwarden config apply``), as the services read it from ``lw_config``.

Two keys, each readable by the services that need it (``shared/permissions.py`` grants reads per key):
``access`` (the tenants' clients and policies, the operators' roster and agent rights: the planner, the
governor, the escalation service and the console read it) and ``console`` (the console's logins: bcrypt
hashes, for the console only). A key that is not there means no access file was applied: each service
falls back to its settings (``LW_OPERATORS``, ``LW_CONSOLE_USERS``, ``LW_TENANTS``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal, get_args

from pydantic import Field, field_validator

from shared.escalation_actions import EscalationKind
from shared.messages.wire import DIGEST_PATTERN, Name, Wire, utcnow
from shared.tenancy import TenantPolicy

# What an operator may do with agents (``lw_agents``): nothing, register new ones and replace those it
# registered itself, or register and replace any.
AgentRight = Literal["none", "own", "all"]
AGENT_RIGHTS: tuple[AgentRight, ...] = ("none", "own", "all")


class OperatorEntry(Wire):
    """One operator of the roster: the queue kinds it may act on (``*``: all) and what it may do to agents."""

    kinds: list[str] = Field(default_factory=lambda: ["*"], description="queue kinds it may act on; * = all")
    agents: AgentRight = "none"

    @field_validator("kinds")
    @classmethod
    def _kinds(cls, v: list[str]) -> list[str]:
        known = (*get_args(EscalationKind), "*")
        for kind in v:
            if kind not in known:
                raise ValueError(f"unknown kind {kind!r} (kinds: {', '.join(known)})")
        return v


class AccessRecord(Wire):
    """``lw_config/access``: the tenants and operators as applied."""

    tenants: dict[Name, TenantPolicy] = Field(default_factory=dict, description="tenant -> its policy")
    tenant_users: dict[Name, Name] = Field(default_factory=dict, description="NATS user -> the tenant it is bound to")
    operators: dict[Name, OperatorEntry] = Field(default_factory=dict, description="the roster")
    digest: str = Field(pattern=DIGEST_PATTERN, description="sha256 of the applied file's canonical form")
    applied_at: datetime = Field(default_factory=utcnow)
    applied_by: str = Field("", max_length=64, description="the NATS user that applied it")

    def roster(self) -> dict[str, list[str]]:
        """The roster as ``LW_OPERATORS`` writes it: operator -> kinds."""
        return {name: list(entry.kinds) for name, entry in self.operators.items()}


class ConsoleUsers(Wire):
    """``lw_config/console``: the operators who may log in to the console, each with a bcrypt hash."""

    users: dict[Name, str] = Field(default_factory=dict)
    digest: str = Field(pattern=DIGEST_PATTERN)
