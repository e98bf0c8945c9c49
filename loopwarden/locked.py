"""``loopwarden up --locked``: the production mode on one machine.

nats-server loads a generated ``auth.conf`` (``shared/permissions.py``) from an access file (the shipped example,
``deploy/access.yaml``, unless ``--access FILE`` names the admin's); ``loopwarden bootstrap`` runs as the admin
user; every service connects as its own NATS user with its own password (``LW_MANAGE_STREAMS=false``); the
applied file is stored in ``lw_config`` (the roster, the console's logins, the tenants' policies); scripted runs
follow ``LW_ALLOW_SCRIPTED`` (the deploy manifests set ``false``).

Everything lives in ``<state>/locked/``: ``access.yaml`` (the file applied), ``nats/server.conf`` including
``nats/auth.conf``, ``passwords.env`` (a fresh password per user the file gives no hash, mode 600: nats-server's
environment) and ``users/<user>.env`` (what a person sources to connect as that user: the URL, the user, its
password, its tenant). ``loopwarden config apply FILE`` then rewrites ``auth.conf`` there and reloads the server.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from shared import subjects as S
from shared.access import EXAMPLE, AccessFile, load_access
from shared.permissions import password_env, render

if TYPE_CHECKING:
    from loopwarden.stack import LocalStack
    from shared.settings import Settings

LOCKED_DIR = "locked"
SERVER_CONF, AUTH_CONF, PASSWORDS, ACCESS = "nats/server.conf", "nats/auth.conf", "passwords.env", "access.yaml"
CONSOLE_COST = 10  # bcrypt work of the generated console logins (a local stack: fast logins)


def new_password() -> str:
    """A fresh password that nats-server reads from its environment as a string: one starting with ``-`` or a
    digit and a ``-`` (``4-y``, ``-ab``; ``secrets.token_urlsafe`` makes both) is parsed as a number there
    ("Expected a digit but got ...") and the server does not start. A letter first keeps it a string."""
    return "p" + secrets.token_urlsafe(18)


def write_private(path: Path, text: str, mode: int = 0o600) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=mode, exist_ok=True)
    path.chmod(mode)
    path.write_text(text)


def read_env_file(path: Path) -> dict[str, str]:
    """``KEY=value`` lines (what ``passwords.env`` and ``users/*.env`` hold)."""
    found = {}
    for line in path.read_text().splitlines():
        key, eq, value = line.partition("=")
        if eq and not key.startswith("#"):
            found[key.strip()] = value.strip()
    return found


@dataclass
class LockedSetup:
    """The files of a locked local stack, made once per state folder (kept across ``up``/``down``)."""

    root: Path
    access: AccessFile
    passwords: dict[str, str]  # user -> password, for every user the access file gives no hash

    @classmethod
    def prepare(cls, state_dir: Path, access_file: Path | None = None) -> LockedSetup:
        """Make (or reuse) ``<state_dir>/locked``: the access file, the passwords, the console logins."""
        root = state_dir / LOCKED_DIR
        access_path = root / ACCESS
        if access_file is not None:  # the admin's own: copied, so `config apply` later compares with it
            text = Path(access_file).read_text()
            load_access(access_file)  # refused here, naming the file, before anything starts
            write_private(access_path, text)
        elif not access_path.exists():
            write_private(access_path, _example_with_console_logins(root))
        access = load_access(access_path)
        passwords_path = root / PASSWORDS
        known = read_env_file(passwords_path) if passwords_path.exists() else {}
        hashed = access.password_hashes()
        passwords = {}
        for user in ("admin", *S.BUILT_IN_USERS[1:], *access.tenant_users(), *access.operators):
            if user in hashed:
                continue
            passwords[user] = known.get(password_env(user)) or new_password()
        write_private(passwords_path, "".join(f"{password_env(u)}={p}\n" for u, p in passwords.items()))
        return cls(root, access, passwords)

    # --- nats-server -------------------------------------------------------------------------------
    def server_config(self, port: int, store: Path, name: str, sync: str | None) -> Path:
        """``nats/server.conf`` (listen, JetStream, ``include ./auth.conf``) and ``nats/auth.conf``."""
        from loopwarden.auth_conf import hosted_tools
        from loopwarden.stack import jetstream_limits

        conf = self.root / SERVER_CONF
        write_private(self.root / AUTH_CONF, render(hosted_tools(), self.access, ACCESS), 0o640)
        jetstream = f'store_dir: "{store}", {jetstream_limits(sync)}'
        write_private(
            conf,
            f'# loopwarden up --locked (docs/access.md)\nlisten: "127.0.0.1:{port}"\nserver_name: "{name}"\n'
            f"jetstream {{ {jetstream} }}\ninclude ./auth.conf\n",
            0o640,
        )
        return conf

    def server_env(self) -> dict[str, str]:
        """nats-server's environment: the passwords ``auth.conf`` names by variable."""
        return {password_env(user): pw for user, pw in self.passwords.items()}

    # --- who connects how -----------------------------------------------------------------------------
    def credentials(self, user: str) -> dict[str, str]:
        """A built-in user's environment: its own user and password, infrastructure made by bootstrap."""
        return {"LW_NATS_USER": user, "LW_NATS_PASSWORD": self.passwords.get(user, ""), "LW_MANAGE_STREAMS": "false"}

    def service_env(self) -> dict[str, dict[str, str]]:
        """Each process's own user: the services, the console (its logins from ``lw_config``: none from the
        environment, so no password file is made for it) and the retention sweep (as the admin)."""
        env = {s: self.credentials(s) for s in ("planner", "executor", "validator", "judge", "governor", "escalation")}
        env["console"] = {**self.credentials("console"), "LW_CONSOLE_USERS": "{}"}
        env["retention"] = self.credentials("admin")
        return env

    def admin_settings(self, nats_url: str) -> Settings:
        from pydantic import SecretStr

        from shared.settings import load_settings

        return load_settings("loopwarden").model_copy(
            update={
                "nats_url": nats_url,
                "nats_user": "admin",
                "nats_password": SecretStr(self.passwords["admin"]),
                "manage_streams": False,
            }
        )

    async def bootstrap_and_apply(self, nats_url: str) -> list[str]:
        """``loopwarden bootstrap`` as the admin, then the access file stored in ``lw_config``: what it did."""
        from loopwarden.client import Client
        from loopwarden.infra import bootstrap
        from shared.live_config import store_access

        cfg = self.admin_settings(nats_url)
        report = await bootstrap(cfg)
        async with Client(cfg, identity="admin") as client:
            await store_access(client.bus, self.access, "admin")
        return [
            f"bootstrap (as admin): {len(report.changed)} streams, buckets and consumers made",
            f"applied {self.root / ACCESS} ({len(self.access.tenants)} tenants, {len(self.access.operators)} "
            "operators) to lw_config",
        ]

    def record(self, stack: LocalStack) -> dict[str, object]:
        """What ``stack.json`` keeps of a locked stack (``loopwarden config apply`` finds its files there)."""
        server = next((p for p in stack.procs if p.name == "nats-server"), None)
        return {
            "root": str(self.root),
            "access": str(self.root / ACCESS),
            "auth_conf": str(self.root / AUTH_CONF),
            "server_conf": str(self.root / SERVER_CONF),
            "nats_pid": server.popen.pid if server is not None else None,
        }

    def how_to_connect(self, nats_url: str) -> list[str]:
        """What ``up --locked`` tells its user: where the files are, how to be each person."""
        files = self.write_user_files(nats_url)
        tenants = self.access.tenant_users()
        lines = [
            f"locked: auth.conf {self.root / AUTH_CONF} from {self.root / ACCESS}; add a tenant or an operator: edit "
            f"that file, then `loopwarden config apply {self.root / ACCESS}` (auth.conf rewritten, nats-server "
            "reloaded, the services told)",
        ]
        for user, path in files.items():
            who = (
                f"tenant {tenants[user]}'s client {user}"
                if user in tenants
                else f"operator {user}"
                if user in self.access.operators
                else f"the {user}"
            )
            lines.append(f"  as {who}: set -a; . {path}; set +a")
        logins = self.console_passwords()
        if logins is not None:
            lines.append(f"  console logins (operators): {logins}")
        return lines

    def write_user_files(self, nats_url: str) -> dict[str, Path]:
        """``users/<user>.env`` for every person (and the admin) whose password this stack made: source one to
        be that user (``set -a; . FILE; set +a``)."""
        written = {}
        tenants = self.access.tenant_users()
        for user in ("admin", "client", *tenants, *self.access.operators):
            if user not in self.passwords:
                continue  # its password is the admin's hash: the admin knows it
            lines = [f"LW_NATS_URL={nats_url}", f"LW_NATS_USER={user}", f"LW_NATS_PASSWORD={self.passwords[user]}"]
            lines.append("LW_MANAGE_STREAMS=false")  # bootstrap made the streams: no one else creates one
            if user in tenants:
                lines.append(f"LW_TENANT={tenants[user]}")
            path = self.root / "users" / f"{user}.env"
            write_private(path, "\n".join(lines) + "\n")
            written[user] = path
        return written

    def console_passwords(self) -> Path | None:
        path = self.root / "console-passwords.txt"
        return path if path.exists() else None


def _example_with_console_logins(root: Path) -> str:
    """The example access file with a fresh console login per operator (written beside it, mode 600)."""
    import bcrypt

    data = json.loads(EXAMPLE.model_dump_json(exclude_none=True))
    logins = {name: secrets.token_urlsafe(9) for name in data.get("operators", {})}
    for name, password in logins.items():
        data["operators"][name]["console_password_hash"] = bcrypt.hashpw(
            password.encode(), bcrypt.gensalt(CONSOLE_COST)
        ).decode()
    write_private(root / "console-passwords.txt", "".join(f"{n} {p}\n" for n, p in logins.items()))
    header = (
        "# The access file of this locked local stack (`loopwarden up --locked`): edit it and run\n"
        "# `loopwarden config apply` with it to add a tenant or an operator (docs/access.md).\n"
    )
    import yaml

    return header + yaml.safe_dump(data, sort_keys=False)
