"""Operators log in to the console (bcrypt hashes from ``LW_CONSOLE_USERS``); sessions are random
tokens kept in the console process. The console's own NATS user then acts *for* the operator on
``...<verb>.console.<operator>`` subjects, so the queue records both identities."""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field

import bcrypt

SESSION_COOKIE = "lw_console_session"


def hash_password(password: str, rounds: int = 12) -> str:
    hashed: bytes = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds))
    return hashed.decode()


@dataclass
class Sessions:
    users: dict[str, str]  # operator -> bcrypt hash
    ttl_s: float = 12 * 3600
    _live: dict[str, tuple[str, float]] = field(default_factory=dict)

    @classmethod
    def from_setting(cls, console_users: str | None) -> Sessions:
        return cls(json.loads(console_users) if console_users else {})

    def login(self, operator: str, password: str) -> str | None:
        """A new session token, or None (unknown operator and wrong password look the same)."""
        hashed = self.users.get(operator)
        if hashed is None:
            bcrypt.checkpw(b"x", bcrypt.hashpw(b"y", bcrypt.gensalt(4)))  # same work either way
            return None
        if not bcrypt.checkpw(password.encode(), hashed.encode()):
            return None
        token = secrets.token_urlsafe(32)
        self._live[token] = (operator, time.monotonic() + self.ttl_s)
        return token

    def operator(self, token: str | None) -> str | None:
        found = self._live.get(token or "")
        if found is None:
            return None
        operator, expires = found
        if time.monotonic() > expires:
            self._live.pop(token or "", None)
            return None
        return operator

    def logout(self, token: str | None) -> None:
        self._live.pop(token or "", None)
