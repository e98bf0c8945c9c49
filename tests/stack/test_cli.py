"""The CLI's commands as a user meets them: help, errors named in one line, an unreachable server, the trace of a
run on the session stack."""

from __future__ import annotations

import subprocess
import sys

from tests.support.cli import clean_env, lw
from tests.support.paths import ROOT
from tests.support.timing import bound


def test_scenario_errors_name_the_field(tmp_path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntask: t\nplanner:\n  - tool_calls: [{input: {}}]\n  - {}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "loopwarden.cli", "check-scenario", str(bad)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=bound(60),
    )
    assert proc.returncode == 2
    assert "planner[0].tool_calls[0].name: Field required" in proc.stderr
    assert "planner[1]: Value error, a turn needs text, tool_calls or error" in proc.stderr


def test_unreachable_nats_fails_fast_naming_the_url(tmp_path) -> None:
    """Every command that talks to NATS: a bounded connect, one line naming the URL, exit 3; local files
    are read first, so a bad one is a usage error (2) even with NATS down."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from loopwarden.stack import free_port

    url = f"nats://127.0.0.1:{free_port()}"  # nothing listens there
    env = clean_env(LW_NATS_URL=url, LW_STATE_DIR=str(tmp_path))
    demo = str(ROOT / "scenarios" / "demo.yaml")
    commands = [
        ("submit", "--scenario", demo),
        ("submit", "--task", "t", "--wait"),
        ("status", "run-x"),
        ("events", "run-x"),
        ("trace", "run-x"),
        ("metrics",),
        ("dlq",),
        ("dlq", "requeue", "1"),
        ("escalations", "list"),
        ("escalations", "claim", "esc-x"),
        ("bootstrap",),
        ("up",),
    ]
    started = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda args: lw(*args, env=env, timeout=bound(60)), commands))
    for args, done in zip(commands, results, strict=True):
        assert done.returncode == 3, (args, done.stdout, done.stderr)
        assert url in done.stderr and "cannot reach NATS" in done.stderr, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr
    print(f"\n{len(commands)} commands against an unreachable server: {time.monotonic() - started:.1f}s in all")

    search = str(ROOT / "schemas" / "tools" / "search.json")
    resolve = ("escalations", "resolve", "e", "--action", "provide_result", "--result")
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{not json")
    local_errors = [
        (("submit", "--scenario", str(tmp_path / "missing.yaml")), "no such file"),
        (("submit", "--scenario", str(bad_json)), "not valid JSON"),
        ((*resolve, "{x"), "--result: the value is not JSON"),
        ((*resolve, "@" + str(tmp_path / "no.json")), "no such file"),
        (("check-contract", str(tmp_path / "missing.json")), "no such file"),
        (("check-contract", search, "--input", "@" + str(bad_json)), "not JSON"),
        (("check-contract", search, "--output", "@/nonexistent"), "no such file"),
        (("check-scenario", str(tmp_path / "missing.yaml")), "no such file"),
        (("replay", str(bad_json)), "not a run export: (message): Invalid JSON"),
        (("export", "run-x", "-o", str(tmp_path / "no" / "x.json")), "no such folder"),
        (("dlq", "requeue", "3", "x"), "'x' is not a letter's number"),
    ]
    with ThreadPoolExecutor(4) as pool:
        local_results = list(pool.map(lambda case: lw(*case[0], env=env, timeout=bound(60)), local_errors))
    for (args, said), done in zip(local_errors, local_results, strict=True):
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert said in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, (args, done.stderr)
    bad_setting = lw("status", "run-x", env={**env, "LW_CLI_CONNECT_TIMEOUT_S": "soon"}, timeout=bound(60))
    assert bad_setting.returncode == 2 and "invalid setting LW_CLI_CONNECT_TIMEOUT_S" in bad_setting.stderr


def test_help_on_every_command_and_option_version_and_json_on_reading_commands() -> None:
    import argparse

    from loopwarden.cli import build_parser

    parser = build_parser()
    missing = []

    def walk(p: argparse.ArgumentParser, path: str) -> None:
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {a.dest: a.help for a in action._choices_actions}
                for name, child in action.choices.items():
                    if not helps.get(name):
                        missing.append(f"{path} {name}")
                    walk(child, f"{path} {name}")
            elif not action.help or action.help == argparse.SUPPRESS:
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")

    walk(parser, "loopwarden")
    assert not missing, missing
    reading = [
        ("status",),
        ("events",),
        ("trace",),
        ("metrics",),
        ("dlq",),
        ("escalations", "list"),
        ("escalations", "show"),
    ]
    for path in reading:
        p = parser
        for name in path:
            p = next(a for a in p._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
        assert "--json" in p._option_string_actions, path
    version = lw("--version", env=clean_env())
    assert version.returncode == 0 and version.stdout.startswith("loopwarden 0.")
    helped = lw("--help", env=clean_env(PYTHONIOENCODING="ascii"))
    assert helped.returncode == 0 and "exit codes:" in helped.stdout and "130" in helped.stdout


def test_bench_runs_in_short_form() -> None:
    """`make bench` measures speed; here it only has to run, and the engines must agree."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--only", "validation"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=bound(120),
    )
    assert proc.returncode == 0, proc.stderr
    assert "engines disagree on            0 of 302" in proc.stdout


def test_the_scenario_schema_is_generated_from_the_model_and_names_the_shipped_scenarios() -> None:
    """schemas/scenario.json is what the Scenario model generates (`make schemas`), every shipped scenario
    names it for editors and validates against it, and it refuses what the loader refuses."""
    import json

    import jsonschema
    import yaml

    from loopwarden.generate.files import render

    committed = (ROOT / "schemas" / "scenario.json").read_text()
    assert committed == render("scenario.json"), (
        "schemas/scenario.json drifted from shared/scenario.py; run `make schemas`"
    )
    validator = jsonschema.Draft202012Validator(json.loads(committed))
    shipped = sorted((ROOT / "scenarios").glob("*.yaml"))
    assert shipped
    for path in shipped:
        text = path.read_text()
        assert text.startswith("# yaml-language-server: $schema=../schemas/scenario.json\n"), path.name
        assert not list(validator.iter_errors(yaml.safe_load(text))), path.name
    bad = {"name": "x", "task": "t", "planner": [{"tool_calls": [{"input": {}}]}], "surprise": 1}
    messages = {e.message for e in validator.iter_errors(bad)}
    assert any("'name' is a required property" in m for m in messages), messages
    assert any("surprise" in m for m in messages), messages


async def test_trace_prints_the_runs_timeline_and_the_trace_id_the_collector_has(client, stack, otlp) -> None:
    """`loopwarden trace RUN`: the trace id is the one the run's spans were exported under (what Jaeger shows
    at LW_JAEGER_URL/trace/<id>), and the timeline is the run's events from its start."""
    import asyncio
    import json

    from shared.scenario import load_scenario

    run_id = await client.submit_scenario(load_scenario(ROOT / "scenarios" / "demo.yaml"))
    assert (await client.wait(run_id, timeout=bound(60))).status == "completed"
    env = clean_env(LW_NATS_URL=str(stack.nats_url), LW_JAEGER_URL="http://jaeger.example:16686")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "loopwarden.cli", "trace", run_id, "--json", env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    shown = json.loads(out)
    client.telemetry.tracer_provider.force_flush()
    roots: list = []
    for _ in range(int(bound(100))):
        roots = [s for s in otlp.spans if s.name == f"run {run_id}"]
        if roots:
            break
        await asyncio.sleep(0.1)
    assert roots and shown["trace_id"] == roots[0].trace_id
    assert shown["jaeger"] == f"http://jaeger.example:16686/trace/{roots[0].trace_id}"
    timeline = shown["timeline"]
    assert timeline[0]["t_s"] == 0 and "run started" in timeline[0]["line"]  # an idle fleet: no wait, no queue
    assert timeline[-1]["subject"].startswith("lw.v1.evt.run.completed") and timeline[-1]["t_s"] > 0
