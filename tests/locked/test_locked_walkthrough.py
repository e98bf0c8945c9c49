"""The docs' locked walkthrough (docs/locked.md), executed: ``loopwarden up --locked`` as the page brings the
deployment up, then every ``sh`` block, line by line, in one shell, as a person would type it. A line ending in
``# → exit N`` must end with that code; every other line with 0. The stand-in model (the session's Messages API)
gets the walkthrough's replies from the file the page starts it with (docs/locked-model.yaml).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from loopwarden.fake_model import FakeModel, load_script
from loopwarden.stack import free_port
from tests.support.locked import ROOT, clean_env, run_cli
from tests.support.timing import bound

DOC = ROOT / "docs" / "locked.md"
EXPECT = re.compile(r"#\s*→\s*exit\s+(\d+)\s*$")


def commands(text: str) -> list[tuple[str, int]]:
    """Each command line of the page's ``sh`` blocks, with the exit code it must end with."""
    out = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            want = EXPECT.search(line)
            out.append((line[: want.start()].rstrip() if want else line, int(want.group(1)) if want else 0))
    return out


def script(cmds: list[tuple[str, int]]) -> str:
    lines = []
    for cmd, code in cmds:
        lines += [
            f"echo '$ '{shlex.quote(cmd)}",
            cmd,
            "rc=$?",
            f'if [ "$rc" -ne {code} ]; then echo "STEP FAILED (exit $rc, not {code}): "{shlex.quote(cmd)}; exit 99; fi',
        ]
    return "\n".join(lines) + "\n"


def test_the_page_has_a_walkthrough_to_run() -> None:
    cmds = commands(DOC.read_text())
    assert (
        len(cmds) > 20
        and cmds[-1] == ("loopwarden down", 0)
        and [c for c, code in cmds if code]
        == [
            "loopwarden dlq",
            'loopwarden escalations claim "$ITEM" --as alice',
        ]
    )


# some forty CLI commands, each a Python start-up, and a locked stack started and stopped: 65 s at load 7, 129 s at
# load 11, past the suite's 120 s per test (pyproject.toml); its shell is bounded at bound(600) below
@pytest.mark.timeout(bound(300))
def test_the_locked_walkthrough_runs_as_written(messages_api: FakeModel, tmp_path: Path) -> None:
    """From the bring-up on: ``LW_ALLOW_SCRIPTED=false loopwarden up --locked`` (on a free port: the machine is
    shared) with the stand-in model the page starts, then every command block, then ``loopwarden down``."""
    _, keyed = load_script(str(ROOT / "docs" / "locked-model.yaml"))  # `loopwarden fake-model --script ...`
    for key, replies in keyed.items():
        messages_api.script(key, replies)
    work = tmp_path / "work"  # the repository's folder, as far as the commands go: its agents and docs
    work.mkdir()
    for name in ("agents", "docs"):
        (work / name).symlink_to(ROOT / name)
    base = clean_env(tmp_path)
    env = {
        **base,
        "PATH": f"{Path(sys.executable).parent}:{base.get('PATH', '')}",  # the installed `loopwarden` (make install)
        "ANTHROPIC_BASE_URL": messages_api.base_url,
        "ANTHROPIC_API_KEY": "fake",
        "LW_ALLOW_SCRIPTED": "false",
        "USERS": str(tmp_path / "state" / "stack" / "locked" / "users"),
    }
    up = run_cli(("up", "--locked", "--port", str(free_port())), env, tmp_path, 300)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "scripted runs: refused (LW_ALLOW_SCRIPTED=false)" in up.stdout, up.stdout
        done = subprocess.run(
            ["bash", "-c", script(commands(DOC.read_text()))],
            cwd=work,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=bound(600),
        )
    finally:
        run_cli(("down",), env, tmp_path, 120)
    out = done.stdout
    assert done.returncode == 0, out[-6000:]
    assert "Traceback" not in out, out
    run_id = re.search(r"run calc --task .*\n(?:.*\n)*?\$ loopwarden status \"\$RUN\"\nrun:\s+(run-\S+)", out)
    assert run_id is not None, out
    run = run_id.group(1)
    assert re.search(rf"\$ loopwarden status \"\$RUN\"\nrun:\s+{run}\nstatus:\s+completed", out), out
    assert (work / "acme-run.json").stat().st_size > 1000 and (work / "alice-run.json").stat().st_size > 1000
    assert "loopwarden dlq: user client_acme may not read the dead letters (LW_DLQ): permission denied" in out
    assert re.search(rf"\$ loopwarden runs --tenant acme\n(?:.*\n)*?{run} .* acme ", out), out
    assert re.search(r"replayed run-\S+ as run-\S+: completed \(recorded: completed\)\n.*\n  no divergence", out), out
    assert re.search(r"tenant acme .*the database rejected the query", out), out
    # the item was filed from the call's failure event and stores no turns: alice's `show` reads the run's last
    # turns from its conversation (her user may read every run; the escalation service may read none)
    shown = out.split('$ loopwarden escalations show "$ITEM"', 1)[1].split("$ loopwarden", 1)[0]
    assert "kind:       fatal" in shown, shown
    turns = shown.split("── Last turns ──", 1)[1]
    assert "user: How many orders are open?" in turns and "assistant: → " in turns, shown
    assert "1 claimed item is not shown" in out, out
    assert "loopwarden escalations: user bob may not ask lw.v1.rpc.escalation.claim.alice: permission denied" in out
    assert "stopped" in out.rsplit("$ loopwarden down", 1)[1], out[-2000:]


def test_up_locked_passwords_are_strings_to_nats_server(tmp_path: Path) -> None:
    """``up --locked`` hands nats-server its users' passwords by environment; a value starting with ``-`` (or a
    digit and a ``-``), which ``secrets.token_urlsafe`` makes, is parsed as a number and the server does not start
    (the walkthrough's bring-up failed so now and then)."""
    from loopwarden.locked import new_password
    from loopwarden.stack import nats_server_binary

    conf = tmp_path / "t.conf"
    conf.write_text('authorization { users: [ { user: "a", password: $X } ] }\n')

    def starts(password: str) -> bool:
        check = [nats_server_binary(), "-t", "-c", str(conf)]
        return subprocess.run(check, env={"X": password}, capture_output=True, timeout=bound(10)).returncode == 0

    assert not starts("-ab") and not starts("4-y")  # what token_urlsafe alone may make
    assert all(starts(p) for p in ["p-ab", "p4-y", *(new_password() for _ in range(20))])
