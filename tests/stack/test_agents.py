"""Agents a user names and runs (issue 24, items 2 and 6), end to end on the session's real stack.

An agent registered from a file or a Python object is stored in lw_agents with a version; a run by
name (`loopwarden run AGENT`, `client.run`) gets the agent's instructions, model, tools, rubric and
limits from the planner, live (through the real SDK against the Messages-API stand-in) or scripted,
and records the agent and version it used; an unknown agent is one line and a dead letter naming it;
`loopwarden runs` lists runs by status, agent, tenant and age. Who may register agents on a locked
deployment is tests/locked/test_agent_permissions.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from loopwarden import Agent, Client, Criterion, Refused, Rubric, RunLimits, RunResult, UnknownAgent, parse_scenario
from loopwarden.fake_model import FakeModel
from loopwarden.stack import LocalStack
from shared.messages import FINAL_STATUSES, RunSubmit
from tests.support.paths import ROOT
from tests.support.timing import bound, polls


def _lw(stack: LocalStack, *args: str, timeout: float = bound(120)) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "LW_NATS_URL", "LW_NATS_USER")}
    env["LW_NATS_URL"] = str(stack.nats_url)
    return subprocess.run(
        [sys.executable, "-m", "loopwarden.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _name(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:6]}"


def _scenario(answer: str, scores: dict[str, float]) -> dict[str, object]:
    return {
        "name": "agent-scripted",
        "task": "What is 6*7?",
        "planner": [
            {"tool_calls": [{"name": "calculator", "input": {"expression": "6*7"}}]},
            {"tool_calls": [{"name": "submit_result", "input": {"answer": answer}}]},
        ],
        "judge": [{"scores": scores}],
    }


async def test_an_agent_from_a_file_runs_by_name_scripted_and_records_its_version(
    client: Client, stack: LocalStack, tmp_path: Path
) -> None:
    name = _name("math")
    path = tmp_path / "math.yaml"
    path.write_text(
        f"name: {name}\ninstructions: You do arithmetic with the calculator.\ntools: [calculator]\n"
        "answer_mode: submit\nrubric:\n  threshold: 0.8\n  criteria:\n    - {name: correct}\n"
        "limits: {max_iterations: 4}\n"
    )
    done = _lw(stack, "agents", "register", str(path))
    assert done.returncode == 0 and done.stdout.strip() == f"registered agent {name} version 1", done.stderr
    again = _lw(stack, "agents", "register", str(path))
    assert again.stdout.strip() == f"agent {name} unchanged (version 1)", again.stderr

    scenario = parse_scenario(_scenario("6*7 = 42", {"correct": 1.0}))
    result = await client.run(name, scenario=scenario, timeout=bound(60))
    assert isinstance(result, RunResult)
    assert (result.status, result.final_output, result.agent, result.agent_version) == (
        "completed",
        "6*7 = 42",
        name,
        1,
    )
    assert result.passed is True and result.reason and result.cost_usd >= 0
    assert result.run_id.startswith("run-")

    # a new definition is the next version; the run made before keeps the version it used
    path.write_text(path.read_text().replace("threshold: 0.8", "threshold: 0.9"))
    assert _lw(stack, "agents", "register", str(path)).stdout.strip() == f"registered agent {name} version 2"
    scenario_file = tmp_path / "s.json"
    scenario_file.write_text(json.dumps(_scenario("6*7 = 42", {"correct": 0.85})))  # under the new threshold
    ran = _lw(stack, "run", name, "--scenario", str(scenario_file), "--wait", "--timeout", "60")
    run_id = ran.stdout.splitlines()[0]
    second = await client.state(run_id)
    assert second is not None and second.agent_version == 2, ran.stdout + ran.stderr
    assert second.first_draft_passed is False  # 0.85 passes version 1's threshold, not version 2's
    first = await client.state(result.run_id)
    assert first is not None and first.agent_version == 1

    shown = _lw(stack, "agents", "show", name, "--json")
    assert json.loads(shown.stdout)["version"] == 2
    assert json.loads(shown.stdout)["definition"]["rubric"]["threshold"] == 0.9
    listed = _lw(stack, "agents", "list")
    assert f"{name}  v2" in listed.stdout


async def test_a_live_run_gets_the_agents_instructions_model_tools_and_limits(
    client: Client, messages_api: FakeModel
) -> None:
    key = uuid.uuid4().hex[:8]
    name = _name("live")
    agent = Agent(
        name=name,
        instructions=f"You are the {name} agent: answer in one line.",
        model="claude-haiku-4-5",
        tools=["calculator"],
        answer_mode="text",
        limits=RunLimits(max_iterations=3),
    )
    stored = await client.register(agent)
    assert stored.version == 1
    messages_api.script(key, [{"content": [{"type": "text", "text": "42"}]}])
    result = await client.run(name, task=f"What is 6*7? [script:{key}]", timeout=bound(60))
    assert (result.status, result.final_output, result.agent_version) == ("completed", "42", 1), result.reason
    (request,) = messages_api.requests[key]
    system = json.dumps(request["system"])
    assert f"You are the {name} agent" in system and "tools provided" in system  # the agent's, then the loop's
    assert request["model"] == "claude-haiku-4-5"
    offered = {t["name"] for t in request.get("tools", [])}
    assert "calculator" in offered and offered <= {"calculator", "submit_result"}, offered
    snap = await client.state(result.run_id)
    assert snap is not None and snap.model == "claude-haiku-4-5"


async def test_an_unknown_agent_is_one_line_exit_1_and_a_dead_letter_naming_it(
    client: Client, stack: LocalStack
) -> None:
    name = _name("nobody")
    done = _lw(stack, "run", name, "--task", "anything", "--wait")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip() == (
        f"loopwarden run: agent '{name}' is not registered (`loopwarden agents list` shows those that are)"
    )
    with pytest.raises(UnknownAgent):
        await client.run(name, task="anything")
    # a submit that names it anyway (not through the client's check) is refused by the planner
    run_id = f"run-{name}"
    with pytest.raises(Refused) as told:  # never started, and its submitter is told why at once
        await client.submit(RunSubmit(run_id=run_id, task="anything", agent=name))
    for _ in range(polls(100)):
        letters = [d for d in await client.dead_letters() if d.service == "planner" and run_id in d.body]
        if letters:
            break
        await asyncio.sleep(0.1)
    assert letters and letters[0].reason.startswith(f"agent '{name}' is not registered"), letters
    assert told.value.reason == letters[0].reason and told.value.quota is None
    refused = await client.wait(run_id, timeout=bound(30), until=FINAL_STATUSES)
    assert refused.status == "refused" and refused.final_reason == letters[0].reason, refused


async def test_an_agent_for_other_tenants_is_refused_for_this_one(client: Client) -> None:
    name = _name("acme-only")
    await client.register(Agent(name=name, tenants=["acme"]))
    run_id = f"run-{name}"
    with pytest.raises(Refused) as told:  # the default tenant's subject
        await client.submit(RunSubmit(run_id=run_id, task="anything", agent=name))
    for _ in range(polls(100)):
        letters = [d for d in await client.dead_letters() if d.service == "planner" and run_id in d.body]
        if letters:
            break
        await asyncio.sleep(0.1)
    assert letters and f"agent '{name}' is not for tenant 'default'" in letters[0].reason
    assert told.value.reason == letters[0].reason
    refused = await client.wait(run_id, timeout=bound(30), until=FINAL_STATUSES)
    assert refused.status == "refused" and refused.final_reason == letters[0].reason, refused


async def test_runs_lists_by_agent_status_and_age_newest_first(client: Client, stack: LocalStack) -> None:
    name = _name("listed")
    await client.register(
        Agent(
            name=name,
            tools=["calculator"],
            answer_mode="submit",
            rubric=Rubric(criteria=[Criterion(name="correct")], threshold=0.5),
        )
    )
    passing = parse_scenario(_scenario("42", {"correct": 1.0}))
    first = await client.run(name, scenario=passing, timeout=bound(60))
    second = await client.run(name, scenario=passing, timeout=bound(60))
    assert first.status == second.status == "completed"

    listed = _lw(stack, "runs", "--agent", name, "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [r["run_id"] for r in rows] == [second.run_id, first.run_id]  # newest first, only this agent's
    assert all(r["agent"] == name and r["agent_version"] == 1 and r["tenant"] == "default" for r in rows)
    page = json.loads(_lw(stack, "runs", "--agent", name, "--limit", "1", "--offset", "1", "--json").stdout)
    assert [r["run_id"] for r in page] == [first.run_id]
    assert json.loads(_lw(stack, "runs", "--agent", name, "--status", "failed", "--json").stdout) == []
    assert len(json.loads(_lw(stack, "runs", "--agent", name, "--since", "10m", "--json").stdout)) == 2
    text = _lw(stack, "runs", "--agent", name)
    assert text.stdout.splitlines()[0].startswith(second.run_id) and f"{name} v1" in text.stdout
    assert _lw(stack, "runs", "--since", "soon").returncode == 2
    runs = await client.runs(agent=name, status="completed")
    assert [r.run_id for r in runs] == [second.run_id, first.run_id]


def _readme_commands() -> list[list[str]]:
    """The `loopwarden` lines of README.md's ```sh blocks (comments dropped), as argument lists."""
    import re
    import shlex

    blocks = re.findall(r"^```sh\n(.*?)^```", (ROOT / "README.md").read_text(), re.M | re.S)
    lines = [line.split("  #")[0].strip() for block in blocks for line in block.splitlines()]
    return [shlex.split(line)[1:] for line in lines if line.startswith(".venv/bin/loopwarden ")]


def test_the_readme_first_agent_commands_run_as_written(stack: LocalStack) -> None:
    commands = _readme_commands()
    assert [c[0] for c in commands] == ["lint", "check-contract", "agents", "run", "runs"], commands
    outputs = []
    for args in commands:
        done = _lw(stack, *args)
        assert done.returncode == 0, f"loopwarden {' '.join(args)}:\n{done.stdout}{done.stderr}"
        outputs.append(done.stdout)
    assert outputs[2].startswith(("registered agent calc version", "agent calc unchanged"))
    run_id = outputs[3].splitlines()[0]
    assert "completed: 17 * 23 = 391" in outputs[3]
    assert outputs[4].splitlines()[0].startswith(run_id) and "calc v" in outputs[4]


async def test_run_refuses_missing_tools_and_checks_expect_as_submit_does(
    client: Client, stack: LocalStack, tmp_path: Path
) -> None:
    """A newcomer's `loopwarden run AGENT --scenario FILE --wait` on a stack without the scenario's tools completed
    and exited 0: `run` had neither `submit`'s refusal of tools the stack does not host nor its `expect` check."""
    name = _name("silent")
    await client.register(Agent(name=name, instructions="Count.", answer_mode="submit"))
    missing = _scenario("6*7 = 42", {"correct": 1.0})
    missing["planner"][0]["tool_calls"][0]["name"] = "low_stock_nowhere"  # type: ignore[index]
    path = tmp_path / "missing.json"
    path.write_text(json.dumps(missing))
    done = _lw(stack, "run", name, "--scenario", str(path), "--wait", "--timeout", "60")
    assert done.returncode == 1 and done.stdout == "", done.stdout + done.stderr
    assert "low_stock_nowhere" in done.stderr and "no executor of the running stack hosts" in done.stderr
    unmet = _scenario("6*7 = 42", {"correct": 1.0})
    unmet["expect"] = {"status": "completed", "tools": {"calculator": {"succeeded": 2}}}
    path.write_text(json.dumps(unmet))
    done = _lw(stack, "run", name, "--scenario", str(path), "--wait", "--timeout", "60")
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.splitlines()[0].startswith("run-")  # the run id first
    assert "EXPECTATION NOT MET: tool calculator" in done.stderr, done.stderr
