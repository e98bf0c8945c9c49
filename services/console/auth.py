"""Operators log in to the console (bcrypt hashes from ``LW_CONSOLE_USERS``). A session is a signed,
expiring token (HMAC with ``LW_CONSOLE_SECRET``), so any console replica accepts it. The console's
own NATS user then acts *for* the operator on ``...<verb>.console.<operator>`` subjects, so the
queue records both identities."""

from __future__ import annotations

import base64
import hashlib
import hmac
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
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    ttl_s: float = 12 * 3600
    _revoked: set[str] = field(default_factory=set)

    @classmethod
    def from_settings(cls, console_users: str | None, secret: str | None, ttl_s: float) -> Sessions:
        users = json.loads(console_users) if console_users else {}
        return cls(users, secret.encode() if secret else secrets.token_bytes(32), ttl_s)

    def _sign(self, body: str) -> str:
        return hmac.new(self.secret, body.encode(), hashlib.sha256).hexdigest()

    def login(self, operator: str, password: str, now: float | None = None) -> str | None:
        """A new session token, or None (an unknown operator and a wrong password look the same)."""
        hashed = self.users.get(operator)
        if hashed is None:
            bcrypt.checkpw(b"x", bcrypt.hashpw(b"y", bcrypt.gensalt(4)))  # comparable work either way
            return None
        if not bcrypt.checkpw(password.encode(), hashed.encode()):
            return None
        expires = int((now or time.time()) + self.ttl_s)
        body = base64.urlsafe_b64encode(json.dumps([operator, expires, secrets.token_hex(8)]).encode()).decode()
        return f"{body}.{self._sign(body)}"

    def operator(self, token: str | None, now: float | None = None) -> str | None:
        """The operator a valid, unexpired, unrevoked token names; None otherwise."""
        if not token or token in self._revoked or "." not in token:
            return None
        body, signature = token.rsplit(".", 1)
        if not hmac.compare_digest(signature, self._sign(body)):
            return None
        try:
            operator, expires, _ = json.loads(base64.urlsafe_b64decode(body.encode()))
        except ValueError:
            return None
        if (now or time.time()) > expires or operator not in self.users:
            return None
        return str(operator)

    def logout(self, token: str | None) -> None:
        if token:
            self._revoked.add(token)
