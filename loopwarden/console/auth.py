"""Operators log in to the console (bcrypt hashes from ``LW_CONSOLE_USERS``). A session is a signed,
expiring token (HMAC with ``LW_CONSOLE_SECRET``), so any console replica accepts it; a logout revokes it
in a store every replica reads (``lw_console_sessions``). The console's own NATS user then acts *for*
the operator on ``...<verb>.console.<operator>`` subjects, so the queue records both identities.

bcrypt is slow on purpose: it runs in a worker thread, a few at a time, never on the event loop. An
unknown operator costs the same work as a known one (a dummy hash of the same cost), so the time taken
does not say which names exist."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import Protocol

import bcrypt

SESSION_COOKIE = "lw_console_session"
MAX_PASSWORD_BYTES = 72  # bcrypt reads no further (and bcrypt 5 refuses longer ones)
DEFAULT_COST = 12
CONCURRENT_CHECKS = 2  # bcrypt checks at once: a burst of logins cannot take every core


class PasswordTooLong(ValueError):
    def __init__(self) -> None:
        super().__init__(f"a password is at most {MAX_PASSWORD_BYTES} bytes")


def hash_password(password: str, rounds: int = 12) -> str:
    hashed: bytes = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds))
    return hashed.decode()


def cost_of(hashed: str) -> int | None:
    """The work factor of a bcrypt hash (``$2b$12$...`` -> 12)."""
    found = re.match(r"\$2[abxy]?\$(\d\d)\$", hashed)
    return int(found.group(1)) if found else None


@dataclass(frozen=True)
class Session:
    operator: str
    sid: str
    expires: int


class Revocations(Protocol):
    """Where a logout is recorded, so that every replica refuses the session from then on."""

    async def revoke(self, sid: str, expires: int) -> None: ...

    async def revoked(self, sid: str) -> bool: ...


@dataclass
class MemoryRevocations:
    """Revocations kept by one process (tests, and a console that has no shared store)."""

    sids: set[str] = field(default_factory=set)

    async def revoke(self, sid: str, expires: int) -> None:
        self.sids.add(sid)

    async def revoked(self, sid: str) -> bool:
        return sid in self.sids


@dataclass
class Sessions:
    users: dict[str, str]  # operator -> bcrypt hash
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    ttl_s: float = 3600.0
    revocations: Revocations = field(default_factory=MemoryRevocations)
    _dummy: bytes | None = field(default=None, init=False, repr=False)
    _checks: asyncio.Semaphore = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._checks = asyncio.Semaphore(CONCURRENT_CHECKS)

    def dummy(self) -> bytes:
        """A hash of the operators' own (highest) cost, made on first use (in the worker thread): an
        unknown name is checked against it, so it costs what a known one does."""
        if self._dummy is None:
            costs = [c for c in (cost_of(h) for h in self.users.values()) if c is not None]
            self._dummy = bcrypt.hashpw(secrets.token_bytes(16), bcrypt.gensalt(max(costs, default=DEFAULT_COST)))
        return self._dummy

    @classmethod
    def from_settings(
        cls, console_users: str | None, secret: str | None, ttl_s: float, revocations: Revocations | None = None
    ) -> Sessions:
        users = json.loads(console_users) if console_users else {}
        key = secret.encode() if secret else secrets.token_bytes(32)
        return cls(users, key, ttl_s, revocations or MemoryRevocations())

    def _sign(self, body: str, purpose: str = "session") -> str:
        return hmac.new(self.secret, f"{purpose}:{body}".encode(), hashlib.sha256).hexdigest()

    # --- passwords ---------------------------------------------------------------------------------
    def password_ok(self, operator: str, password: str) -> bool:
        """bcrypt, blocking (call it from a worker thread). Too long a password is refused before any work."""
        secret = password.encode()
        if len(secret) > MAX_PASSWORD_BYTES:
            raise PasswordTooLong()
        hashed = self.users.get(operator)
        if hashed is None:
            bcrypt.checkpw(secret, self.dummy())  # the same work either way
            return False
        return bcrypt.checkpw(secret, hashed.encode())

    async def login(self, operator: str, password: str, now: float | None = None) -> str | None:
        """A new session token, or None (an unknown operator and a wrong password look the same)."""
        if len(password.encode()) > MAX_PASSWORD_BYTES:
            raise PasswordTooLong()
        async with self._checks:
            ok = await asyncio.to_thread(self.password_ok, operator, password)
        return self.issue(operator, now) if ok else None

    def who(self, typed: str) -> str:
        """How a log line names what was typed as an operator: a known name as itself, anything else
        (perhaps a password typed in the wrong field) only as a keyed digest that correlates attempts."""
        if typed in self.users:
            return repr(typed)
        return f"an unknown name #{self._sign(typed, 'log')[:10]}"

    # --- tokens ------------------------------------------------------------------------------------
    def issue(self, operator: str, now: float | None = None) -> str:
        expires = int((now or time.time()) + self.ttl_s)
        body = base64.urlsafe_b64encode(json.dumps([operator, expires, secrets.token_hex(16)]).encode()).decode()
        return f"{body}.{self._sign(body)}"

    def verify(self, token: str | None, now: float | None = None) -> Session | None:
        """The session a well-signed, unexpired token of a known operator names (revocation not checked)."""
        if not token or "." not in token:
            return None
        body, signature = token.rsplit(".", 1)
        if not hmac.compare_digest(signature, self._sign(body)):
            return None
        try:
            operator, expires, sid = json.loads(base64.urlsafe_b64decode(body.encode()))
        except ValueError:
            return None
        if (now or time.time()) > expires or operator not in self.users:
            return None
        return Session(str(operator), str(sid), int(expires))

    async def session(self, token: str | None, now: float | None = None) -> Session | None:
        """The session of a valid token not revoked on any replica; None otherwise."""
        found = self.verify(token, now)
        if found is None or await self.revocations.revoked(found.sid):
            return None
        return found

    async def operator(self, token: str | None, now: float | None = None) -> str | None:
        found = await self.session(token, now)
        return found.operator if found else None

    async def logout(self, token: str | None, now: float | None = None) -> None:
        found = self.verify(token, now)
        if found is not None:
            await self.revocations.revoke(found.sid, found.expires)

    def csrf(self, session: Session) -> str:
        """The form token of a session: a page of another origin cannot read it, so cannot post with it."""
        return self._sign(session.sid, "csrf")[:32]

    def csrf_ok(self, session: Session, token: str) -> bool:
        return hmac.compare_digest(self.csrf(session), token)
