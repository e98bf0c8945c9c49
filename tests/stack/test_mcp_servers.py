"""Real MCP servers mounted as users mount them (issue 14): the official ``mcp-server-time`` and
``mcp-server-git`` from PyPI, and the lab server for what the reference servers do not do.

One extra executor process mounts them through ``LW_MCP_SERVERS`` and hosts only their tools;
runs go through the whole stack (planner, executor, validator, escalation) like any run.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loopwarden.client import Client
from loopwarden.stack import LocalStack, Proc
from shared import subjects as S
from shared.messages import McpServerStatus, RunSnapshot, ToolContract
from tests.support.runs import escalations_of, run_scenario
from tests.support.timing import bound, polls

TIME_TOOLS = ["get_current_time", "convert_time"]
GIT_TOOLS = ["git_status", "git_add", "git_commit", "git_log", "git_show"]
LAB_TOOLS = ["write_note", "profile", "snapshot", "sleep", "big", "charge"]
PATIENT = {"start_timeout_s": 90}  # servers that must come up do, even on a loaded 2-core machine


def tool_results(state: RunSnapshot) -> list[Any]:
    return [b for m in state.messages if m.role == "user" for b in m.content if b.type == "tool_result"]


def submit(answer: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "submit_result", "input": {"answer": answer}}]}


def call(name: str, **args: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "input": args}]}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, timeout=bound(30)
    ).stdout


def processes_with(marker: str) -> list[int]:
    """Pids whose command line holds ``marker`` (a lab server started by this test)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(arg.startswith(marker.encode()) for arg in argv):
                pids.append(int(entry))
    return pids


def gone(marker: str, timeout: float = bound(10.0)) -> bool:
    deadline = time.monotonic() + timeout
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    return processes_with(marker) == []


def start_executor(stack: LocalStack, label: str, servers: list[dict[str, Any]], tools: list[str]) -> Proc:
    proc = stack.start_service(
        "executor",
        label=label,
        extra_env={"LW_MCP_SERVERS": json.dumps(servers), "LW_EXECUTOR_TOOLS": ",".join(tools)},
    )
    stack.wait_ready([proc], timeout=bound(180))
    return proc


def stop(proc: Proc, sig: int = signal.SIGTERM) -> None:
    if proc.popen.poll() is None:
        proc.popen.send_signal(sig)
        proc.popen.wait(bound(30))


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gitrepo")
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "user.email", "t@example.invalid")
    git(path, "config", "user.name", "Test")
    (path / "README.md").write_text("hello\n")
    git(path, "add", "README.md")
    git(path, "commit", "-q", "-m", "first commit")
    (path / "notes.txt").write_text("release on friday\n")
    return path


@pytest.fixture(scope="module")
def reference_executor(stack: LocalStack, repo: Path) -> Iterator[Proc]:
    servers = [
        {"name": "time", "command": [sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC"], **PATIENT},
        {
            "name": "git",
            "command": [sys.executable, "-m", "mcp_server_git", "--repository", str(repo)],
            "tools": GIT_TOOLS,
            **PATIENT,
        },
    ]
    proc = start_executor(stack, "executor-mcp-reference", servers, [*TIME_TOOLS, *GIT_TOOLS])
    yield proc
    stop(proc)


async def test_the_time_server_mounts_and_a_bad_timezone_is_corrected_by_the_model(
    client: Client, reference_executor: Proc
) -> None:
    state = await run_scenario(
        client,
        {
            "name": "mcp-time-typo",
            "task": "What time is it in Berlin?",
            "planner": [
                call("get_current_time", timezone="Europe/Berlln"),
                {"text": "I misspelled the zone.", **call("get_current_time", timezone="Europe/Berlin")},
                submit("It is Monday in Berlin."),
            ],
        },
    )
    assert state.status == "completed", state.final_reason
    bad, good = tool_results(state)
    assert bad.is_error and "Invalid timezone" in bad.content and "Europe/Berlln" in bad.content
    assert "'get_current_time' reported an error" in bad.content
    assert not good.is_error and json.loads(good.content)["timezone"] == "Europe/Berlin"
    kinds = [e.kind for e in await client.events(state.run_id)]
    assert "failure.tool_error.get_current_time" in kinds  # a recoverable tool error, not fatal
    assert not any(k.startswith("failure.fatal") for k in kinds)
    assert (await client.escalations(run_id=state.run_id)).escalations == []


async def test_the_same_tool_error_again_and_again_is_a_loop(client: Client, reference_executor: Proc) -> None:
    state = await run_scenario(
        client,
        {
            "name": "mcp-time-repeated-error",
            "task": "Convert 25 o'clock UTC to Tokyo time.",
            "planner": [
                call("convert_time", source_timezone="UTC", time="25:00", target_timezone="Asia/Tokyo"),
                call("convert_time", source_timezone="UTC", time="26:00", target_timezone="Asia/Tokyo"),
                call("convert_time", source_timezone="UTC", time="27:00", target_timezone="Asia/Tokyo"),
                submit("There is no 25 o'clock."),
            ],
        },
    )
    assert state.status == "completed", state.final_reason
    results = tool_results(state)
    assert all(r.is_error and "Invalid time format" in r.content for r in results[:3])
    loops = [e for e in await client.events(state.run_id) if e.kind == "failure.loop.convert_time"]
    assert loops and loops[0].payload["detail"]["pattern"] == "repeated_error"


async def test_git_text_results_reach_the_model_and_a_commit_error_is_fixed(
    client: Client, reference_executor: Proc, repo: Path
) -> None:
    head_before = git(repo, "rev-parse", "HEAD").strip()
    state = await run_scenario(
        client,
        {
            "name": "mcp-git",
            "task": "Commit the release notes.",
            "planner": [
                call("git_status", repo_path=str(repo)),
                call("git_commit", repo_path=str(repo), message="Add release notes"),
                {
                    "text": "Nothing was staged; staging first.",
                    **call("git_add", repo_path=str(repo), files=["notes.txt"]),
                },
                call("git_commit", repo_path=str(repo), message="Add release notes"),
                call("git_log", repo_path=str(repo), max_count=2),
                submit("Committed notes.txt."),
            ],
        },
    )
    assert state.status == "completed", state.final_reason
    status, refused, added, committed, log = tool_results(state)
    # plain text, as the server sent it: no schema was written for any git tool
    assert not status.is_error and status.content.startswith("Repository status:\nOn branch main")
    assert "notes.txt" in status.content and "Untracked files" in status.content
    assert refused.is_error and "No changes staged for commit. Use git_add to stage changes first" in refused.content
    assert "check the current state before calling it again" in refused.content  # git_commit is not idempotent
    assert not added.is_error and not committed.is_error
    assert committed.content.startswith("Changes committed successfully with hash ")
    assert "Add release notes" in log.content and "first commit" in log.content
    # the side effect happened exactly once
    assert git(repo, "rev-list", "--count", f"{head_before}..HEAD").strip() == "1"
    events = await client.events(state.run_id)
    failure = next(e for e in events if e.kind == "failure.tool_error.git_commit")
    assert failure.payload["recoverable"] is True and failure.payload["effect"] == "may_have"


# --- the lab server: results, side effects, lifecycle -----------------------------------------------


@pytest.fixture(scope="module")
def lab(stack: LocalStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    marker = f"lab-marker-{os.getpid()}-{time.time_ns()}"
    notes = tmp_path_factory.mktemp("lab") / "notes.txt"
    lab_cmd = [sys.executable, "-m", "services.executor.tools.mcp_lab"]
    servers = [
        {
            "name": "lab",
            "command": [*lab_cmd, marker],
            "env": {"LAB_NOTES": str(notes), "LAB_START_DELAY_S": "1", "LAB_LINGER": "1"},
            "tools": [t for t in LAB_TOOLS if t != "sleep"],
            "restart_base_s": 0.2,
            "max_result_chars": 5000,
            **PATIENT,
        },
        {
            "name": "slowlab",
            "command": [*lab_cmd, f"slow-{marker}"],
            "env": {"LAB_START_DELAY_S": "1"},
            "prefix": "slow_",
            "tools": ["profile"],
            **PATIENT,
        },
        {"name": "sleeper", "command": [*lab_cmd, f"sleeper-{marker}"], "tools": ["sleep"], "timeout_s": 2, **PATIENT},
        {
            "name": "stuck",
            "command": [*lab_cmd, f"stuck-{marker}"],
            "env": {"LAB_HANG": "1"},
            "start_timeout_s": bound(1.5),
            "restart_base_s": 30,
        },
    ]
    gate = tmp_path_factory.mktemp("late") / "ready"
    servers.append(
        {
            "name": "late",
            "command": [*lab_cmd, f"late-{marker}"],
            "env": {"LAB_HANG_UNLESS": str(gate)},
            "prefix": "late_",
            "tools": ["profile"],
            # long enough for a Python server's handshake on a loaded machine once its gate is open (a shorter
            # one timed out start after start there, and the test waited a minute for "up")
            "start_timeout_s": bound(4),
            "restart_base_s": 0.5,
            "restart_max_s": 1.0,
        }
    )
    started = time.monotonic()
    proc = start_executor(stack, "executor-mcp-lab", servers, [*LAB_TOOLS, "slow_profile", "late_profile"])
    yield {"proc": proc, "marker": marker, "notes": notes, "gate": gate, "ready_s": time.monotonic() - started}
    stop(proc)
    assert gone(marker, timeout=bound(1))  # a clean stop ends its servers, even one that lingers after its stdin closes


async def server_events(client: Client, server: str, executor_pid: int, wait_s: float = 0.5) -> list[McpServerStatus]:
    """Every status event of ``server`` published by the executor with this pid, oldest first."""
    sub = await client.bus.js.subscribe(S.mcp_server_event(server), ordered_consumer=True)
    out = []
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=wait_s)
            except TimeoutError:
                break
            status = McpServerStatus.model_validate_json(msg.data)
            if status.executor.endswith(f":{executor_pid}"):
                out.append(status)
    finally:
        await sub.unsubscribe()
    return out


async def wait_for_state(
    client: Client, server: str, pid: int, state: str, after: int = 0, timeout: float = bound(90)
) -> list[McpServerStatus]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = await server_events(client, server, pid, wait_s=0.3)
        if any(e.state == state for e in events[after:]):
            return events
        await asyncio.sleep(0.2)
    raise AssertionError(f"{server} never reached {state}: {[(e.state, e.detail) for e in events]}")


async def test_servers_start_concurrently_and_a_stuck_one_is_reported_not_waited_for(
    client: Client, lab: dict[str, Any]
) -> None:
    pid = lab["proc"].popen.pid
    lab_events = await server_events(client, "lab", pid)
    slow_events = await server_events(client, "slowlab", pid)
    stuck_events = await wait_for_state(client, "stuck", pid, "failed")  # after its own start-up timeout
    assert [e.state for e in lab_events][:2] == ["starting", "up"]
    assert [e.state for e in slow_events][:2] == ["starting", "up"]
    # both servers delay their handshake by 1 s; concurrently, each started before the other was up
    assert max(lab_events[0].at, slow_events[0].at) < min(lab_events[1].at, slow_events[1].at)
    # the stuck server failed after its own start-up timeout; the executor became ready anyway
    failed = next(e for e in stuck_events if e.state == "failed")
    assert f"no handshake and tool list within {bound(1.5):g}s (start_timeout_s)" in failed.detail
    assert failed.next_start_in_s == 30
    kv_status, _ = await client.bus.kv_get(S.KV_MCP_SERVERS, S.kv_key("stuck", failed.executor), McpServerStatus)
    assert kv_status is not None and kv_status.state == "failed"
    up, _ = await client.bus.kv_get(S.KV_MCP_SERVERS, S.kv_key("lab", failed.executor), McpServerStatus)
    assert up is not None and up.state == "up" and "write_note" in up.tools


async def test_a_server_that_failed_at_start_has_its_tools_hosted_once_it_comes_up(
    client: Client, lab: dict[str, Any]
) -> None:
    pid = lab["proc"].popen.pid
    first = await wait_for_state(client, "late", pid, "failed")
    assert "start_timeout_s" in next(e for e in first if e.state == "failed").detail
    lab["gate"].write_text("go")  # the next restart completes its handshake
    events = await wait_for_state(client, "late", pid, "up", after=len(first))
    assert any("late_profile" in e.tools for e in events if e.state == "up")
    # "up" is reported as its tools start being hosted; its contract is published once the executor consumes them
    for _ in range(polls(200)):
        contract, _ = await client.bus.kv_get(S.KV_CONTRACTS, S.kv_key("late_profile"), ToolContract)
        if contract is not None:
            break
        await asyncio.sleep(0.1)
    assert contract is not None, "late_profile was never published to the catalogue"
    state = await run_scenario(
        client,
        {"name": "mcp-lab-late", "task": "Whose profile?", "planner": [call("late_profile"), submit("Ada.")]},
    )
    assert state.status == "completed", state.final_reason
    (profile,) = tool_results(state)
    assert not profile.is_error and json.loads(profile.content)["name"] == "Ada"


async def test_text_and_mixed_content_reach_the_model_as_sent_and_capped(client: Client, lab: dict[str, Any]) -> None:
    state = await run_scenario(
        client,
        {
            "name": "mcp-lab-content",
            "task": "What does the dashboard say?",
            "planner": [
                {"tool_calls": [{"name": "snapshot", "input": {}}, {"name": "big", "input": {"chars": 9000}}]},
                call("profile"),
                submit("Search is degraded."),
            ],
        },
    )
    assert state.status == "completed", state.final_reason
    snapshot, big, profile = tool_results(state)
    assert snapshot.content.startswith("3 services up, 1 degraded (search).\n[image content: image/png, about")
    assert "[resource link: runbook <file:///runbooks/search.md>]" in snapshot.content
    assert "[resource <memo://oncall>]\non call: Grace" in snapshot.content
    assert big.content.startswith("x" * 100) and "[result cut: 4000 more characters]" in big.content
    # the server added 'timezone' to its output; its declared schema stays open by default
    assert not profile.is_error and json.loads(profile.content) == {"name": "Ada", "timezone": "Europe/Berlin"}


async def test_a_result_rejected_after_a_side_effect_never_invites_a_repeat(
    client: Client, lab: dict[str, Any]
) -> None:
    before = lab["notes"].read_text().count("\n") if lab["notes"].exists() else 0
    state = await run_scenario(
        client,
        {
            "name": "mcp-lab-effect",
            "task": "Write a note.",
            "planner": [call("write_note", text="bad id please"), submit("The note was written.")],
        },
    )
    assert state.status == "completed", state.final_reason
    (result,) = tool_results(state)
    assert result.is_error
    assert "'write_note' ran and reported success, so its effect has taken place" in result.content
    assert "$.note_id must be an integer" in result.content and "Do not call it again" in result.content
    assert "Make a new call" not in result.content
    assert lab["notes"].read_text().count("\n") == before + 1
    events = await client.events(state.run_id)
    failure = next(e for e in events if e.kind == "failure.tool_error.write_note")
    assert failure.payload["effect"] == "took_effect"
    assert not any(e.kind.startswith("failure.output_invalid") for e in events)


async def test_a_slow_read_only_call_times_out_and_is_retried(client: Client, lab: dict[str, Any]) -> None:
    state = await run_scenario(
        client,
        {
            "name": "mcp-lab-timeout",
            "task": "Wait.",
            "planner": [call("sleep", seconds=5), submit("It timed out.")],
        },
        timeout=bound(60),
    )
    (result,) = tool_results(state)
    assert result.is_error and "did not respond in time" in result.content
    attempts = [e for e in await client.events(state.run_id) if e.kind == "tool.attempt.sleep"]
    assert [a.payload["failure_type"] for a in attempts] == ["timeout"] * 3  # idempotent: retried


async def test_a_server_dying_mid_call_is_an_unknown_outcome_for_a_non_idempotent_tool(
    client: Client, lab: dict[str, Any]
) -> None:
    pid = lab["proc"].popen.pid
    seen = len(await server_events(client, "lab", pid))
    state = await run_scenario(
        client,
        {"name": "mcp-lab-crash", "task": "Charge 5 EUR.", "planner": [call("charge", cents=500, crash=True)]},
        until=("awaiting_human",),
    )
    assert state.awaiting is not None and state.awaiting.kind == "unknown_outcome"  # a human decides, no retry
    items = await escalations_of(client, state.run_id)
    assert [e.kind for e in items] == ["unknown_outcome"]
    events = await client.events(state.run_id)
    assert [e.payload["failure_type"] for e in events if e.kind == "tool.attempt.charge"] == ["unknown_outcome"]
    failure = next(e for e in events if e.kind == "failure.unknown_outcome.charge")
    assert failure.payload["effect"] == "may_have"
    assert (await client.resolve(state.awaiting.escalation_id, "oncall", "abort", "checked the ledger")).ok
    await wait_for_state(client, "lab", pid, "up", after=seen + 1)  # restarted


async def test_a_dead_server_is_reported_and_restarted(client: Client, lab: dict[str, Any]) -> None:
    pid = lab["proc"].popen.pid
    seen = len(await server_events(client, "lab", pid))
    (server_pid,) = processes_with(lab["marker"])
    os.kill(server_pid, signal.SIGKILL)
    events = await wait_for_state(client, "lab", pid, "down", after=seen)
    down = next(e for e in events[seen:] if e.state == "down")
    assert down.detail == "the server process exited" and down.next_start_in_s == 0.2
    events = await wait_for_state(client, "lab", pid, "up", after=seen)
    assert events[-1].state == "up" and events[-1].restarts == events[seen - 1].restarts + 1
    assert processes_with(lab["marker"]) not in ([], [server_pid])
    state = await run_scenario(
        client, {"name": "mcp-lab-after-restart", "task": "Profile?", "planner": [call("profile"), submit("Ada")]}
    )
    assert state.status == "completed" and not tool_results(state)[0].is_error


async def test_no_server_outlives_a_killed_executor(stack: LocalStack, client: Client) -> None:
    marker = f"orphan-marker-{os.getpid()}-{time.time_ns()}"
    servers = [
        {
            "name": "orphan",
            "command": [sys.executable, "-m", "services.executor.tools.mcp_lab", marker],
            "env": {"LAB_LINGER": "1"},  # does not exit when the executor's end of its stdin closes
            **PATIENT,
        },
        {
            "name": "orphan2",
            "command": [sys.executable, "-m", "services.executor.tools.mcp_lab", f"{marker}-2"],
            "prefix": "orphan2_",
            "env": {"LAB_LINGER": "1"},
            **PATIENT,
        },
    ]
    proc = start_executor(stack, "executor-mcp-orphans", servers, ["profile"])
    assert len(processes_with(marker)) == 2  # both servers run
    proc.popen.send_signal(signal.SIGKILL)
    proc.popen.wait(bound(10))
    assert gone(marker)  # the kernel killed them with the executor (PR_SET_PDEATHSIG)
