"""The supervisor ``loopwarden up`` leaves running: it starts the services (and the retention sweep) as its
children and starts again any that exits, after a backoff, logging each restart, within a bound.

A process that exits (killed, crashed, its NATS connection closed for good) is started again after
``1, 2, 4, ... 30`` seconds; one that ran for ``STABLE_S`` is forgiven its earlier exits. One that exits
``MAX_RESTARTS`` times within ``WINDOW_S`` is left stopped and the log says so (a crash loop is a fault to
read, not to hide). ``loopwarden down`` stops the supervisor, which stops its children first. The current
process ids are in ``<state>/supervised.json``; the log is ``<state>/logs/supervisor.log``.

On a machine with systemd, the units in ``deploy/systemd/`` do the same for a bare-metal deployment
(``Restart=on-failure``; docs/operations.md, "Supervision").

``python -m loopwarden.supervise SPEC`` (``SPEC``: a JSON file ``up`` writes, mode 600: the server's URL,
the state folder, the environment and the services).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loopwarden.stack import LocalStack, Proc, StackError, process_start

log = logging.getLogger("loopwarden.supervise")
BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
STABLE_S = 60.0  # a process that ran this long starts again from the first backoff
MAX_RESTARTS, WINDOW_S = 5, 600.0
SUPERVISED = "supervised.json"
READY_LINE = "supervisor: every process is ready"


@dataclass
class Watched:
    label: str
    service: str  # "" for the retention sweep
    proc: Proc
    started: float
    exits: deque[float] = field(default_factory=deque)
    due: float | None = None  # when it is started again
    gave_up: bool = False


class Supervisor:
    def __init__(self, stack: LocalStack, retention: bool = True) -> None:
        self.stack, self.retention = stack, retention
        self.watched: list[Watched] = []
        self.stopping = self.started = False

    def start(self) -> None:
        self.stack.start()  # every service, each ready (or the start fails and stops what it started)
        now = time.monotonic()
        self.watched = [Watched(p.name, p.service, p, now) for p in self.stack.procs if p.name != "nats-server"]
        if self.retention:
            self.watched.append(Watched("retention", "", self.stack.start_retention(), now))
        self.record()
        self.started = True
        log.info(READY_LINE)

    def record(self) -> None:
        path = self.stack.state_dir / SUPERVISED
        pids = {w.label: w.proc.popen.pid for w in self.watched if not w.gave_up}
        started = {label: process_start(pid) for label, pid in pids.items()}  # to tell a later process by its pid
        gave_up = [w.label for w in self.watched if w.gave_up]
        metrics = self.stack.metrics_urls()  # each service's health port is kept across its restarts
        tmp = path.with_suffix(".tmp")
        record = {"pids": pids, "started": started, "gave_up": gave_up, "metrics": metrics}
        tmp.write_text(json.dumps(record, indent=2))
        tmp.replace(path)

    def check(self, now: float) -> None:
        """One look at the children: schedule a restart for each that exited, start those that are due."""
        for w in self.watched:
            if w.gave_up:
                continue
            if w.due is None and w.proc.popen.poll() is not None:
                code = w.proc.popen.returncode
                if now - w.started >= STABLE_S:
                    w.exits.clear()
                while w.exits and now - w.exits[0] > WINDOW_S:
                    w.exits.popleft()
                w.exits.append(now)
                if len(w.exits) > MAX_RESTARTS:
                    w.gave_up = True
                    log.error(
                        "supervisor: %s exited with code %s, its %d exit within %.0fs: left stopped (its log: %s)",
                        w.label, code, len(w.exits), WINDOW_S, w.proc.log,
                    )  # fmt: skip
                    self.record()
                    continue
                delay = BACKOFF_S[min(len(w.exits), len(BACKOFF_S)) - 1]
                w.due = now + delay
                log.warning(
                    "supervisor: %s exited with code %s; starting it again in %.0fs (restart %d of at most %d "
                    "within %.0fs)",
                    w.label, code, delay, len(w.exits), MAX_RESTARTS, WINDOW_S,
                )  # fmt: skip
            if w.due is not None and now >= w.due:
                w.due = None
                self.stack.procs.remove(w.proc)
                w.proc = self._again(w)
                w.started = now
                log.warning("supervisor: started %s again (pid %d)", w.label, w.proc.popen.pid)
                self.record()

    def _again(self, w: Watched) -> Proc:
        if not w.service:
            return self.stack.start_retention()
        port = {"LW_HEALTH_PORT": str(w.proc.health_port)} if w.proc.health_port else None  # the same /metrics
        return self.stack.start_service(w.service, label=w.label, extra_env=port)

    def run(self, poll_s: float = 0.5) -> None:
        while not self.stopping:
            self.check(time.monotonic())
            time.sleep(poll_s)

    def stop(self, *_: Any) -> None:
        self.stopping = True
        if not self.started:  # still starting: what started is stopped (``LocalStack.start``), now
            raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    spec = json.loads(Path(args[0]).read_text())
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stdout)
    stack = LocalStack(
        state_dir=Path(spec["state_dir"]),
        nats_url=spec["nats_url"],
        env=spec.get("env", {}),
        env_per_service=spec.get("env_per_service", {}),
        services=tuple(spec["services"]),
        ready_timeout_s=spec.get("ready_timeout_s"),
    )
    supervisor = Supervisor(stack, retention=spec.get("retention", True))
    signal.signal(signal.SIGTERM, supervisor.stop)
    signal.signal(signal.SIGINT, supervisor.stop)
    try:
        supervisor.start()
    except StackError as err:
        log.error("supervisor: could not start the services: %s", err)
        return 3
    except KeyboardInterrupt:
        log.info("supervisor: stopped while starting")
        return 130
    try:
        supervisor.run()
    finally:
        stack.stop_procs([p for p in stack.procs if p.name != "nats-server"])
        log.info("supervisor: stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())


def supervised_metrics(state_dir: Path) -> dict[str, str]:
    """Where each supervised process serves its metrics (label -> URL), as the supervisor recorded it."""
    try:
        found = json.loads((state_dir / SUPERVISED).read_text()).get("metrics") or {}
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in found.items()}


def spawn_supervisor(stack: LocalStack, retention: bool = True) -> Proc:
    """Start the supervisor of ``stack``'s services (detached: it outlives ``up``) and wait until it says every
    process is ready; a :class:`StackError` with its log's tail when it exits first or readiness does not come."""
    from loopwarden.locked import write_private
    from loopwarden.stack import open_log, read_from, tail

    assert stack.nats_url is not None
    spec = stack.state_dir / "supervisor-spec.json"  # the services' passwords: mode 600
    write_private(
        spec,
        json.dumps(
            {
                "nats_url": stack.nats_url,
                "state_dir": str(stack.state_dir),
                "env": stack.env,
                "env_per_service": stack.env_per_service,
                "services": list(stack.services),
                "ready_timeout_s": stack.ready_timeout(),
                "retention": retention,
            }
        ),
    )
    log = stack.state_dir / "logs" / "supervisor.log"
    stdout = open_log(log)
    start = stdout.tell()
    popen = subprocess.Popen(
        [sys.executable, "-m", "loopwarden.supervise", str(spec)],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=stdout,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    stdout.close()
    proc = Proc("supervisor", popen, log, log_start=start)
    stack.procs.append(proc)
    deadline = time.monotonic() + stack.ready_timeout() + 10
    while time.monotonic() < deadline:
        if READY_LINE.encode() in read_from(log, start):
            return proc
        if popen.poll() is not None:
            raise StackError(f"the supervisor exited with code {popen.returncode}:\n{tail(log)}")
        time.sleep(0.1)
    raise StackError(f"the services were not ready after {stack.ready_timeout():g}s:\n{tail(log)}")
