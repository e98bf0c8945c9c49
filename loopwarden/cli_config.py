"""Commands for the admin of a deployment: ``config check|apply|show|hash`` (docs/access.md).

``config apply FILE --auth-conf PATH`` is the one step that adds (or removes) a tenant or an operator, and
rotates a password: it writes ``auth.conf`` where the servers include it, reloads the servers it is told of,
and stores the file in ``lw_config``, from which the escalation service's roster, the console's logins and the
tenants' policies are read live. No code and no service's grant changes; nats-server reloads, nothing restarts.
"""

from __future__ import annotations

import argparse
import getpass
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from loopwarden.cli_common import (
    FAILED,
    OK,
    USAGE,
    UserError,
    add_json_flag,
    connected,
    emit_json,
    recorded_stack,
    say,
    settings,
)

DESCRIPTION = (
    "Tenants and operators as configuration: one access file (YAML; schemas/access.json; the example is "
    "deploy/access.yaml) declares the tenants (their NATS client users, their policy) and the operators (roster "
    "kinds, agent rights, NATS and console password hashes). `apply` writes auth.conf, reloads nats-server and "
    "stores the file in lw_config, where the services read it live (run it as the admin NATS user)."
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "config", help="tenants and operators: check and apply the access file (admin)", description=DESCRIPTION
    )
    actions = p.add_subparsers(dest="config_action", metavar="ACTION", required=True)
    q = actions.add_parser(
        "check", help="validate an access file", description="Validate an access file and say what it declares."
    )
    q.add_argument("file", metavar="FILE", help="the access file (.yaml, .yml or .json)")
    q.set_defaults(func=cmd_check)
    q = actions.add_parser(
        "apply",
        help="write auth.conf, reload nats-server, store the file for the services",
        description="Write auth.conf from the access file to --auth-conf PATH (where nats-server includes it; on a "
        "stack started with `loopwarden up --locked`, its own), send each --reload PID (or pid file) the reload "
        "signal, and store the file in lw_config as the admin NATS user (LW_NATS_USER=admin; on an `up --locked` "
        "stack, its admin). Adding or removing a tenant or an operator, and rotating a password whose hash is in "
        "the file, is this and nothing else: a reload, no restart.",
    )
    q.add_argument("file", metavar="FILE", help="the access file")
    q.add_argument("--auth-conf", metavar="PATH", help="where to write auth.conf (the file nats-server includes)")
    q.add_argument(
        "--reload",
        metavar="PID",
        action="append",
        default=[],
        help="a nats-server to reload after writing auth.conf (its pid, or its pid file); repeat per node",
    )
    q.add_argument("--no-store", action="store_true", help="only write auth.conf (nothing is sent to NATS)")
    q.add_argument(
        "--upgrading",
        action="store_true",
        help="while the last release's replicas still run: keep the rights this release retired (docs/upgrades.md); "
        "apply again without it once the last of them has stopped",
    )
    q.set_defaults(func=cmd_apply)
    q = actions.add_parser(
        "show",
        help="what is applied (lw_config)",
        description="The tenants and operators applied, as services read them.",
    )
    add_json_flag(q)
    q.set_defaults(func=cmd_show)
    q = actions.add_parser(
        "hash",
        help="bcrypt a password for the access file",
        description="Read a password (a prompt on a terminal, else one line of standard input) and print its bcrypt "
        "hash, for password_hash or console_password_hash.",
    )
    q.add_argument("--cost", type=int, default=12, help="bcrypt work factor (default: 12)")
    q.set_defaults(func=cmd_hash)

    p = sub.add_parser(
        "cluster-config",
        help="one node's nats-server config of a cluster on one machine",
        description="Write node N's nats-server config for a cluster of --nodes nodes on one machine: its own client, "
        "route and monitoring ports (4222, 6222, 8222 plus N-1 unless given), its store under --dir, the route "
        "user's password (LW_NATS_ROUTE_PASSWORD) and the other nodes' routes, and the include of the shared "
        "auth.conf. Give each node its own file: overriding ports with nats-server flags (--cluster) drops the "
        "route authorization. docs/clustering.md has the recipe.",
    )
    p.add_argument("--node", type=int, required=True, metavar="N", help="which node (1 to --nodes)")
    p.add_argument("--nodes", type=int, default=3, help="how many nodes (default: 3)")
    p.add_argument(
        "--dir", default="/var/lib/loopwarden/nats", help="the nodes' folder: node N keeps its store in DIR/nN"
    )
    p.add_argument("--auth-conf", metavar="PATH", help="the auth.conf every node includes (default: DIR/auth.conf)")
    p.add_argument("--host", default="127.0.0.1", help="the address the nodes listen on (default: 127.0.0.1)")
    p.add_argument("--client-port", type=int, default=4222, help="node 1's client port (node N: plus N-1)")
    p.add_argument("--cluster-port", type=int, default=6222, help="node 1's route port (node N: plus N-1)")
    p.add_argument("--http-port", type=int, default=8222, help="node 1's monitoring port, on loopback (plus N-1)")
    p.add_argument("--out", metavar="FILE", help="write here, mode 600 (default: DIR/nN/server.conf; - prints it)")
    p.set_defaults(func=cmd_cluster_config)


def _load(path: str) -> Any:
    from shared.access import AccessError, load_access

    try:
        return load_access(path)
    except AccessError as err:
        raise UserError(str(err), USAGE) from None


def _summary(access: Any) -> list[str]:
    hashed = access.password_hashes()
    lines = []
    for tenant, entry in access.tenants.items():
        policy = entry.policy.model_dump(exclude_none=True)
        users = ", ".join(f"{u}{'' if u in hashed else ' (password from the environment)'}" for u in entry.users)
        lines.append(f"tenant {tenant}: users {users or '-'}; policy {policy or 'the defaults'}")
    for name, entry in access.operators.items():
        login = "console login" if entry.console_password_hash else "no console login"
        env = "" if name in hashed else ", NATS password from the environment"
        lines.append(f"operator {name}: kinds {', '.join(entry.kinds)}; agents {entry.agents}; {login}{env}")
    return lines


def cmd_check(args: argparse.Namespace) -> int:
    access = _load(args.file)
    for line in _summary(access):
        say(line)
    say(f"{args.file}: valid ({len(access.tenants)} tenants, {len(access.operators)} operators)")
    return OK


def _locked_stack() -> dict[str, Any] | None:
    record = recorded_stack()
    locked = record.get("locked") if record else None
    return locked if isinstance(locked, dict) else None


def _admin_settings(locked: dict[str, Any] | None) -> Any:
    """The admin's settings: the environment's user, else (on an `up --locked` stack) the stack's admin."""
    from pydantic import SecretStr

    from loopwarden.locked import read_env_file

    cfg = settings()
    if cfg.nats_user or locked is None:
        return cfg
    admin = read_env_file(Path(locked["root"]) / "users" / "admin.env")
    return cfg.model_copy(update={"nats_user": "admin", "nats_password": SecretStr(admin["LW_NATS_PASSWORD"])})


def reload_server(target: str) -> int:
    """Send nats-server ``target`` (a pid, or a pid file) the reload signal (SIGHUP); its pid."""
    try:
        pid = int(Path(target).read_text().strip()) if not target.isdigit() else int(target)
    except (OSError, ValueError) as err:
        raise UserError(f"--reload {target}: not a pid nor a readable pid file ({err})", USAGE) from None
    try:
        os.kill(pid, signal.SIGHUP)
    except ProcessLookupError:
        raise UserError(f"--reload {target}: no process {pid}", FAILED) from None
    except PermissionError:
        raise UserError(f"--reload {target}: not allowed to signal process {pid}", FAILED) from None
    return pid


def _check_server_config(conf: Path, env: dict[str, str]) -> None:
    """``nats-server -t`` on the stack's config before it is reloaded (a refused file is reported, not loaded)."""
    from loopwarden.stack import nats_server_binary

    run = subprocess.run(
        [nats_server_binary(), "-t", "-c", str(conf)], env={**os.environ, **env}, capture_output=True, text=True
    )
    if run.returncode != 0:
        said = " ".join((run.stderr or run.stdout).split())
        raise UserError(f"nats-server refuses the new configuration (nothing reloaded): {said}", FAILED)


def cmd_apply(args: argparse.Namespace) -> Any:
    from loopwarden.auth_conf import auth_conf, write_private

    access = _load(args.file)
    locked = _locked_stack()
    out = Path(args.auth_conf) if args.auth_conf else (Path(locked["auth_conf"]) if locked else None)
    if out is None:
        raise UserError("give --auth-conf PATH: where your nats-server includes auth.conf", USAGE)
    own = locked if locked is not None and out.resolve() == Path(locked["auth_conf"]).resolve() else None
    env = _stack_passwords(own, access, args.file) if own is not None else {}
    previous = out.read_text() if out.exists() else None
    write_private(out, auth_conf(access, Path(args.file).name, upgrading=args.upgrading))
    targets = list(args.reload) or ([str(own["nats_pid"])] if own is not None else [])
    if own is not None:
        try:  # the stack's server reads it before it is reloaded: a refused file is put back, nothing reloaded
            _check_server_config(Path(own["server_conf"]), env)
        except UserError:
            if previous is not None:
                write_private(out, previous)
            raise
        if Path(args.file).resolve() != Path(own["access"]).resolve():
            write_private(Path(own["access"]), Path(args.file).read_text())
    say(f"wrote {out}")
    for line in _summary(access):
        say(f"  {line}")
    for target in targets:
        say(f"reloaded nats-server (pid {reload_server(target)})")
    if not targets:
        say("reload every nats-server that includes it: nats-server --signal reload=<pid> (no restart needed)")
    if args.no_store:
        say("not stored in lw_config (--no-store): the services keep what was applied before")
        return OK
    return store(_admin_settings(locked), access)  # run by the CLI (a coroutine: the one async part)


def _stack_passwords(own: dict[str, Any], access: Any, file: str) -> dict[str, str]:
    """The environment of an `up --locked` stack's nats-server; a user the file gives no hash and that
    environment no password cannot be added by a reload: refused before anything is written."""
    from loopwarden.locked import PASSWORDS, read_env_file
    from shared.permissions import password_env

    env = read_env_file(Path(own["root"]) / PASSWORDS)
    hashed = access.password_hashes()
    missing = [u for u in (*access.tenant_users(), *access.operators) if u not in hashed and password_env(u) not in env]
    if missing:
        raise UserError(
            f"{', '.join(missing)}: no password_hash in {file}, and this stack's nats-server has no "
            f"{password_env(missing[0])} (a reload cannot give it one): add a hash (`loopwarden config hash`)",
            USAGE,
        )
    return env


async def store(cfg: Any, access: Any) -> int:
    """Store ``access`` in ``lw_config`` as the user of ``cfg`` (the admin)."""
    from nats.js.errors import BucketNotFoundError

    from shared import subjects as S
    from shared.live_config import store_access

    async with connected(cfg, identity=cfg.nats_user or "admin") as client:
        try:
            await store_access(client.bus, access, cfg.nats_user or "")
        except BucketNotFoundError:
            raise UserError(f"{S.KV_CONFIG} is not there: run `loopwarden bootstrap` (admin) first", FAILED) from None
        except TimeoutError:
            raise UserError(
                f"could not store {S.KV_CONFIG}: NATS user {cfg.nats_user or '(none)'} may not write it "
                "(apply as the admin: LW_NATS_USER=admin)",
                FAILED,
            ) from None
    say(f"stored in {S.KV_CONFIG} (digest {access.digest()[:12]}): the services act on it within "
        f"{cfg.config_refresh_s:g}s (LW_CONFIG_REFRESH_S)")  # fmt: skip
    return OK


async def cmd_show(args: argparse.Namespace) -> int:
    from shared import subjects as S
    from shared.messages import AccessRecord, ConsoleUsers

    cfg = _admin_settings(_locked_stack())
    async with connected(cfg, identity=cfg.nats_user or "admin") as client:
        try:
            access, _ = await client.bus.kv_get(S.KV_CONFIG, S.CONFIG_ACCESS, AccessRecord)
            console, _ = await client.bus.kv_get(S.KV_CONFIG, S.CONFIG_CONSOLE, ConsoleUsers)
        except TimeoutError:
            raise UserError(f"NATS user {cfg.nats_user or '(none)'} may not read {S.KV_CONFIG}", FAILED) from None
    if access is None:
        if args.json:
            emit_json(None)
        else:
            say("no access file applied: the services use LW_OPERATORS, LW_CONSOLE_USERS and LW_TENANTS")
        return OK
    if args.json:
        emit_json({**access.model_dump(mode="json"), "console_logins": sorted(console.users) if console else []})
        return OK
    say(f"applied {access.applied_at:%Y-%m-%d %H:%M:%S}Z by {access.applied_by or '?'} (digest {access.digest[:12]})")
    for tenant, policy in access.tenants.items():
        users = [u for u, t in access.tenant_users.items() if t == tenant]
        say(f"tenant {tenant}: users {', '.join(users) or '-'}; policy {policy.model_dump(exclude_none=True) or '-'}")
    for name, entry in access.operators.items():
        login = "console login" if console and name in console.users else "no console login"
        say(f"operator {name}: kinds {', '.join(entry.kinds)}; agents {entry.agents}; {login}")
    return OK


def cmd_hash(args: argparse.Namespace) -> int:
    import bcrypt

    if not 4 <= args.cost <= 31:
        raise UserError("--cost is between 4 and 31", USAGE)
    if sys.stdin.isatty():
        password = getpass.getpass("password: ")
        if getpass.getpass("again: ") != password:
            raise UserError("the passwords differ", USAGE)
    else:
        password = sys.stdin.readline().rstrip("\n")
    if not password:
        raise UserError("an empty password", USAGE)
    if len(password.encode()) > 72:
        raise UserError("a password is at most 72 bytes (bcrypt reads no further)", USAGE)
    say(bcrypt.hashpw(password.encode(), bcrypt.gensalt(args.cost)).decode())
    return OK


def cmd_cluster_config(args: argparse.Namespace) -> int:
    from loopwarden.auth_conf import write_private
    from loopwarden.cluster_conf import Layout, node_config
    from shared.settings import sync_interval

    root = Path(args.dir).expanduser().absolute()
    layout = Layout(args.nodes, args.host, args.client_port, args.cluster_port, args.http_port, root)
    auth = Path(args.auth_conf).expanduser().absolute() if args.auth_conf else root / "auth.conf"
    raw_sync = os.environ.get("LW_NATS_SYNC_INTERVAL", "").strip()
    try:
        sync = sync_interval(raw_sync) if raw_sync else None
        text = node_config(layout, args.node, os.environ.get("LW_NATS_ROUTE_PASSWORD", ""), auth, sync)
    except ValueError as err:
        raise UserError(str(err), USAGE) from None
    if args.out == "-":
        say(text.rstrip("\n"))
        return OK
    out = Path(args.out) if args.out else layout.node_dir(args.node) / "server.conf"
    write_private(out, text)
    os.chmod(out, 0o600)
    say(f"wrote {out}: node {args.node} of {args.nodes}, clients on {layout.client_url(args.node)}")
    if args.node == 1:
        say(f"every process: LW_NATS_URL={layout.servers()}")
    return OK
