"""What the CLI reads from a run, a file or an export is someone else's text: it cannot drive the
operator's terminal (D15), run real tools on a replay (D16), or hang the CLI (D18); what the CLI and the
retention sweep write is the owner's only (D23).

Each attack runs end to end: the run is submitted to the session stack and read back through the real
``loopwarden`` command, the crafted export is replayed by the real command against the stack's executors,
the alias bomb is given to the real ``check-scenario`` and ``submit``, the archive is written by the real sweep.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from loopwarden.client import Client
from loopwarden.records import archive as archive_run
from loopwarden.records import collect
from loopwarden.replay import NOT_RUN
from loopwarden.stack import LocalStack, free_port
from shared import subjects as S
from shared.scenario import load_scenario, parse_scenario
from tests.support.paths import ROOT
from tests.support.runs import escalations_of
from tests.support.stacks import settings_for
from tests.support.timing import bound

ESC, BEL = "\x1b", "\x07"
CLIPBOARD = f"{ESC}]52;c;cm0gLXJmIH4K{BEL}"  # OSC 52: write the operator's clipboard
CLEAR = f"{ESC}[2J"  # CSI 2J: clear the screen
TITLE = f"{ESC}]0;owned{BEL}"  # OSC 0: the window title
C1_CSI = "\x9b31m"  # the 8-bit CSI some terminals act on too
PLANTED = f"{CLIPBOARD}{CLEAR}{TITLE}{C1_CSI}"


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = bound(120)) -> subprocess.CompletedProcess[str]:
    drop = ("NATS_URL", "LW_NATS_URL", "LW_STATE_DIR", "XDG_STATE_HOME", "PYTHONIOENCODING")
    base = {k: v for k, v in os.environ.items() if k not in drop}
    return subprocess.run(
        [sys.executable, "-m", "loopwarden.cli", *args],
        cwd=ROOT,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        encoding="utf-8",
        timeout=timeout,
    )


def no_controls(done: subprocess.CompletedProcess[str]) -> None:
    for name, text in (("stdout", done.stdout), ("stderr", done.stderr)):
        bad = sorted({f"{ord(c):#04x}" for c in text if (ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F})
        assert not bad, f"{name} carries control characters {bad}: {text[:2000]!r}"


# --- D15: terminal escapes planted in a run ------------------------------------------------------------


async def test_status_events_and_escalations_show_print_no_escape_a_run_planted(
    client: Client, stack: LocalStack
) -> None:
    answered = {
        "name": "planted-answer",
        "task": f"Answer {PLANTED} politely",
        "planner": [
            {"text": f"thinking {PLANTED}", "tool_calls": [{"name": "calculator", "input": {"expression": "1+1"}}]},
            {"tool_calls": [{"name": "submit_result", "input": {"answer": f"two {PLANTED} done"}}]},
        ],
    }
    escalated = {
        "name": "planted-escalation",
        "task": f"Escalate {PLANTED}",
        "planner": [{"tool_calls": [{"name": "calculator", "id": "toolu_x", "input": {"expression": "2+2"}}]}],
        "tools": {"calculator": [{"fail": "fatal", "error": f"broken {PLANTED}", "times": "always"}]},
    }
    a = await client.submit_scenario(parse_scenario(answered))
    b = await client.submit_scenario(parse_scenario(escalated))
    state = await client.wait(a, timeout=bound(60))
    assert state.status == "completed" and PLANTED in (state.final_output or ""), state
    await client.wait(b, timeout=bound(60), until=("awaiting_human", "completed", "stopped", "failed"))
    [item] = await escalations_of(client, b)
    assert PLANTED in item.reason, item.reason  # the text arrived as planted: the CLI is what must not pass it on

    env = {"LW_NATS_URL": str(stack.nats_url)}
    runs = [
        ("status", a),
        ("status", a, "--json"),
        ("events", a),
        ("events", a, "--json"),
        ("trace", a),
        ("escalations", "show", item.escalation_id),
        ("escalations", "show", item.escalation_id, "--json"),
        ("escalations", "list", "--run", b),
        ("events", b),
    ]
    outputs = await asyncio.gather(*(asyncio.to_thread(cli, *args, env=env) for args in runs))
    for args, done in zip(runs, outputs, strict=True):
        assert done.returncode == 0, (args, done.stderr)
        no_controls(done)
    status, status_json = outputs[0].stdout, outputs[1].stdout
    assert "two \\x1b]52;c;cm0gLXJmIH4K\\x07\\x1b[2J" in status  # shown, defused
    assert json.loads(status_json)["final_output"] == f"two {PLANTED} done"  # --json: the same text, escaped
    assert f"broken {PLANTED}" in json.loads(outputs[6].stdout)["reason"]
    assert all(json.loads(line)["subject"] for line in outputs[3].stdout.splitlines())
    assert "\\x1b]0;owned\\x07" in outputs[2].stdout  # the task, in `run started`


# --- D16: a crafted export replayed -----------------------------------------------------------------------


def crafted_export(customer: str) -> dict[str, Any]:
    """The review's export: its only turn calls charge_card, and no tool output is recorded for it."""
    now = datetime.now(UTC).isoformat()
    turn = {
        "text": "charging",
        "tool_calls": [
            {
                "name": "charge_card",
                "id": "toolu_1",
                "input": {"customer_id": customer, "amount_cents": 4200, "currency": "usd"},
            }
        ],
    }
    return {
        "format": "loopwarden.run-record",
        "run_id": f"run-crafted{uuid.uuid4().hex[:8]}",
        "exported_at": now,
        "task": "Please replay me",
        "status": "completed",
        "final_output": "done",
        "provider": "scripted",
        "config": {"answer_mode": "auto", "terminal_tools": ["submit_result"]},
        "model_calls": [
            {"key": "x.turn1", "purpose": "plan", "n": 1, "response": turn},
            {
                "key": "x.turn2",
                "purpose": "plan",
                "n": 2,
                "response": {"text": "", "tool_calls": [{"name": "submit_result", "input": {"answer": "done"}}]},
            },
        ],
    }


async def charges_of(client: Client, customer: str) -> list[str]:
    kv, found = await client.bus.kv(S.KV_DEMO), []
    for key in await client.bus.keys(S.KV_DEMO):
        if key.startswith("charge."):
            entry = await kv.get(key)
            if json.loads(entry.value or b"{}").get("customer_id") == customer:
                found.append(key)
    return found


async def test_replaying_a_crafted_export_charges_no_card_unless_live_tools_are_allowed(
    client: Client, stack: LocalStack, tmp_path: Path
) -> None:
    customer = f"cus_replay{uuid.uuid4().hex[:8]}"
    path = tmp_path / "crafted.json"
    path.write_text(json.dumps(crafted_export(customer)))
    env = {"LW_NATS_URL": str(stack.nats_url)}

    started = time.monotonic()
    done = await asyncio.to_thread(cli, "replay", str(path), "--timeout", f"{bound(60):g}", env=env)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "dry run" in done.stderr and "charge_card (turn 1, call toolu_1)" in done.stderr, done.stderr
    assert "--allow-live-tools" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert time.monotonic() - started < bound(30)  # refused before anything was submitted
    await asyncio.sleep(bound(1.0))  # had anything been submitted, its charge would be stored by now
    assert await charges_of(client, customer) == []

    # a recorded attempt that was retried (transient) leaves the next attempt unscripted: refused too
    retried = crafted_export(customer)
    retried["tool_calls"] = [
        {
            "attempt_id": "a1",
            "iteration": 1,
            "call_id": "toolu_1",
            "tool": "charge_card",
            "attempts": [{"attempt": 1, "ok": False, "failure_type": "transient", "error": "503"}],
        }
    ]
    path.write_text(json.dumps(retried))
    done = await asyncio.to_thread(cli, "replay", str(path), env=env)
    assert done.returncode == 1 and "last recorded attempt transient" in done.stderr, done.stderr

    # --save writes a scenario that is a dry run as well: the unrecorded call fails visibly, nothing runs
    saved = tmp_path / "crafted.yaml"
    path.write_text(json.dumps(crafted_export(customer)))
    assert cli("replay", str(path), "--save", str(saved), env=env).returncode == 0
    run_id = await client.submit_scenario(load_scenario(saved))
    state = await client.wait(run_id, timeout=bound(60), until=("awaiting_human", "completed", "stopped", "failed"))
    assert state.status == "awaiting_human", state  # the charge failed visibly: a person decides
    [item] = await escalations_of(client, run_id)
    assert NOT_RUN in item.reason and item.tool == "charge_card", item.reason
    assert await charges_of(client, customer) == []

    # asked for, the live tool runs: the flag is the only thing between the export and the card
    path.write_text(json.dumps(crafted_export(customer)))
    done = await asyncio.to_thread(cli, "replay", str(path), "--allow-live-tools", "--timeout", "60", env=env)
    assert "replayed run-crafted" in done.stdout, done.stdout + done.stderr
    assert len(await charges_of(client, customer)) == 1


# --- D18: a YAML alias bomb ---------------------------------------------------------------------------------

BOMB = """name: bomb
task: expand me
planner:
  - text: hi
tools:
  search:
    - output:
        a: &a ["x","x","x","x","x","x","x","x","x","x"]
        b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]
        c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]
        d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]
        e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]
        f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]
        g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f,*f]
        h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g,*g]
"""


def test_an_alias_bomb_is_refused_at_once_by_check_scenario_and_submit(stack: LocalStack, tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BOMB)  # 10^8 leaves in 700 bytes
    env = {"LW_NATS_URL": str(stack.nats_url)}
    for args in (
        ("check-scenario", str(bomb)),
        ("submit", "--scenario", str(bomb), "--wait", "--timeout", f"{bound(20):g}"),
    ):
        started = time.monotonic()
        try:
            done = cli(*args, env=env, timeout=bound(30))
        except subprocess.TimeoutExpired:
            raise AssertionError(f"`loopwarden {' '.join(args)}` hung on the alias bomb") from None
        assert time.monotonic() - started < bound(15), args
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert "line 8 column 12: YAML anchors and aliases are not allowed" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    # merge keys are aliases too; a plain scenario still loads
    merged = tmp_path / "merged.yaml"
    merged.write_text("name: m\ntask: t\nx: &base {text: hi}\nplanner:\n  - <<: *base\n")
    assert (
        "anchors and aliases are not allowed"
        in cli("check-scenario", str(merged)).stdout + cli("check-scenario", str(merged)).stderr
    )
    assert cli("check-scenario", str(ROOT / "scenarios" / "demo.yaml")).returncode == 0


def test_a_scenario_over_the_size_bound_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"name": "big", "task": "t", "planner": [{"text": "x" * 5_000_000}]}))
    done = cli("check-scenario", str(big))
    assert done.returncode == 2 and "at most 4000000" in done.stdout + done.stderr, done.stdout + done.stderr


# --- D23: archived records --------------------------------------------------------------------------------


async def test_the_archive_is_readable_by_its_owner_only(client: Client, stack: LocalStack, tmp_path: Path) -> None:
    scenario = {
        "name": f"archived-{free_port()}",
        "task": "Compute, then submit.",
        "planner": [{"tool_calls": [{"name": "submit_result", "input": {"answer": "42"}}]}],
    }
    run_id = await client.submit_scenario(parse_scenario(scenario))
    assert (await client.wait(run_id, timeout=bound(60))).status == "completed"
    archive = tmp_path / "archive" / "runs"
    old = os.umask(0o022)  # a usual umask: without the fix files come out 0644, folders 0755
    try:  # what the retention sweep does for each finished run
        where = await archive_run(
            client.bus, settings_for(stack, archive_dir=str(archive)), await collect(client.bus, run_id)
        )
    finally:
        os.umask(old)
    path = archive / f"{run_id}.json"
    assert where == [str(path)]
    assert json.loads(path.read_text())["run_id"] == run_id
    assert stat.S_IMODE(path.stat().st_mode) == 0o600, oct(path.stat().st_mode)
    assert stat.S_IMODE(archive.stat().st_mode) == 0o700, oct(archive.stat().st_mode)
    assert not [p for p in archive.iterdir() if stat.S_IMODE(p.stat().st_mode) & 0o077]
