"""Run records (issue 15) against the real stack: export, replay, retention, bounded storage."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from loopwarden.client import Client, scenario_submit
from loopwarden.fake_model import FakeModel
from loopwarden.generate.records import record_schema
from loopwarden.records import export_run, prefixed_values, purge_handled_commands, run_events, sweep
from loopwarden.replay import replay, scenario_yaml
from loopwarden.stack import LocalStack
from services.planner.state import RunState
from shared import subjects as S
from shared.bus import RUN_ID_HEADER, ensure_buckets, kv_history, kv_keys, scan_all, stream_config
from shared.messages import Rubric, RunSubmit, utcnow
from shared.records import RunRecord, trajectory
from shared.scenario import load_scenario, parse_scenario
from shared.settings import Settings
from tests.support.runs import escalations_of, run_scenario
from tests.support.stacks import settings_for
from tests.support.timing import bound, polls

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "schemas" / "records" / "RunRecord.json"


def demo() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "scenarios" / "demo.yaml").read_text())
    return data


def waiting() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "scenarios" / "correction-escalates.yaml").read_text())
    return data


async def stored(client: Client) -> dict[str, int]:
    return {i.config.name or "": i.state.bytes for i in await client.bus.js.streams_info()}


def test_schema_file_matches_the_model() -> None:
    assert SCHEMA.read_text() == record_schema(), "run `make schemas`"


def soon() -> datetime:
    """The sweep's clock a little ahead: a record the planner saved a moment after the test saw the run
    end (a late message applied to a finished run) has not outlived a retention of 0 s at "now"."""
    return utcnow() + timedelta(seconds=10)


async def test_export_holds_the_whole_run_and_replays_without_divergence(client: Client, tmp_path: Path) -> None:
    state = await run_scenario(client, demo())
    assert state.status == "completed", state.final_reason
    record = await export_run(client.bus, client.settings, state.run_id)
    data = json.loads(record.model_dump_json(by_alias=True))
    jsonschema.validate(data, json.loads(SCHEMA.read_text()))

    assert record.task == state.task and record.status == "completed" and record.final_output == state.final_output
    planned, _ = await client.bus.kv_get(S.KV_RUNS, state.run_id, RunState)  # the planner's own record
    assert planned is not None and record.config["max_iterations"] == planned.config.max_iterations
    assert record.config["rubric"]
    assert [c.n for c in record.model_calls if c.purpose == "plan"] == [1, 2, 3]
    assert record.model_calls[0].request_messages == 1  # the first request carried the task only
    assert record.model_calls[0].response["tool_calls"][0]["name"] == "search"
    search = next(t for t in record.tool_calls if t.tool == "search")
    assert [(a.ok, a.failure_type) for a in search.attempts] == [(False, "transient"), (True, None)]
    assert search.has_output and search.raw_output["totalCount"] == "1"  # raw, before the repair
    assert search.outcome is not None and search.outcome["repaired"] is True
    assert {t.tool for t in record.tool_calls} == {"search", "calculator", "submit_result"}
    assert [v["status"] for v in record.verdicts] == ["passed"]
    assert record.usage["cost_usd"] == state.usage.cost_usd > 0
    assert record.budget is not None and record.scenario is not None
    assert record.trace_id and len(record.trace_id) == 32  # the stack exports spans: events carry traceparent
    assert any(e.kind == "run.completed" for e in record.events)

    # the file is a scenario: `submit --scenario FILE` and `replay FILE` read it
    path = tmp_path / "export.json"
    path.write_text(record.model_dump_json(by_alias=True))
    scenario = load_scenario(path)
    assert len(scenario.planner) == 3 and scenario.tools["search"][0].fail == "transient"

    report = await replay(client, record)
    assert report.same, report.lines()
    assert report.status == "completed" and report.replay_run != state.run_id
    assert next(s.value for s in report.replayed if s.what == "validation") == "valid (repaired)"


async def test_replay_reports_where_the_current_code_diverges(client: Client) -> None:
    state = await run_scenario(client, demo())
    record = await export_run(client.bus, client.settings, state.run_id)
    # The incident: the search backend returned a count no repair rule can fix. Replaying the
    # recorded run with that output, the validator now rejects it where the recording accepted it.
    search = next(t for t in record.tool_calls if t.tool == "search")
    search.raw_output = {**search.raw_output, "totalCount": "about one"}
    report = await replay(client, record)
    assert not report.same
    assert any(
        d.startswith("validation #1: recorded iteration 1 search: valid (repaired); replay") for d in report.divergences
    ), report.lines()
    assert not any(d.startswith("decide") for d in report.divergences)  # the run went on as recorded

    # another incident: the judge scored the answer low. The replay's Decide step takes another row.
    record = await export_run(client.bus, client.settings, state.run_id)
    for criterion in record.verdicts[0]["criteria"]:
        criterion["score"] = 0.1
    report = await replay(client, record)
    assert any(d.startswith("decide #3: recorded iteration 3: row 5: complete") for d in report.divergences), (
        report.lines()
    )
    assert any(m.startswith("status: expected completed") for m in report.mismatches), report.lines()


async def test_a_run_recorded_with_the_anthropic_provider_replays_without_a_key(
    client: Client, messages_api: FakeModel, stack: LocalStack, tmp_path: Path
) -> None:
    key = f"k{uuid.uuid4().hex[:8]}"
    usage = {"input_tokens": 100, "output_tokens": 10}
    messages_api.script(
        key,
        [
            {
                "content": [
                    {"type": "text", "text": "Computing."},
                    {"type": "tool_use", "id": "toolu_r1", "name": "calculator", "input": {"expression": "6*7"}},
                ],
                "usage": usage,
            },
            {
                "content": [
                    {"type": "tool_use", "id": "toolu_r2", "name": "submit_result", "input": {"answer": "6*7 = 42"}}
                ],
                "usage": usage,
            },
            {
                "content": [{"type": "text", "text": json.dumps({"scores": {"correct": 1.0}, "reasons": {}})}],
                "usage": {"input_tokens": 50, "output_tokens": 5},
            },
        ],
    )
    run_id = f"run-rec-{key}"
    await client.submit(
        RunSubmit(
            run_id=run_id,
            task=f"What is 6*7? [script:{key}]",
            rubric=Rubric(criteria=[{"name": "correct"}], threshold=0.5),
        )
    )
    state = await client.wait(run_id, timeout=bound(60))
    assert state.status == "completed", state.final_reason
    calls_to_the_api = len(messages_api.requests[key])
    assert calls_to_the_api == 3

    record = await export_run(client.bus, client.settings, run_id)
    assert record.provider == "live" and record.scenario is None
    path = tmp_path / f"{run_id}.json"
    path.write_text(record.model_dump_json(by_alias=True))

    # `loopwarden replay FILE` with no key anywhere in its environment
    env = {k: v for k, v in os.environ.items() if k not in ("ANTHROPIC_API_KEY", "NATS_URL")}
    env["LW_NATS_URL"] = stack.nats_url or ""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "loopwarden.cli",
        "replay",
        str(path),
        "--timeout",
        "60",
        env=env,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out = (await asyncio.wait_for(proc.communicate(), bound(120)))[0].decode()
    assert proc.returncode == 0, out
    assert "no divergence" in out and "completed (recorded: completed)" in out
    # the recorded turns were replayed by the scripted provider: the Messages API saw nothing more
    assert len(messages_api.requests[key]) == calls_to_the_api

    # the same file, saved as a scenario, is a regression test like every file in scenarios/
    saved = parse_scenario(yaml.safe_load(scenario_yaml(record, "incident")))
    assert saved.expect is not None and saved.expect.final_output_equals == "6*7 = 42"
    _, mismatches = await client.run_and_check(saved)
    assert mismatches == []


async def test_finished_runs_expire_waiting_runs_do_not(client: Client, stack: LocalStack, tmp_path: Path) -> None:
    finished = await run_scenario(client, demo())
    waits = await run_scenario(client, waiting(), until=("awaiting_human",))
    assert (finished.status, waits.status) == ("completed", "awaiting_human")
    await escalations_of(client, waits.run_id)
    mine = {finished.run_id, waits.run_id}
    recorded = await export_run(client.bus, client.settings, finished.run_id)

    # the event stream has no age limit of its own: a run waiting on a human keeps its events
    assert stream_config(S.STREAM_EVT, Settings()).max_age == 0
    info = await client.bus.js.stream_info(S.STREAM_EVT)
    assert not info.config.max_age

    archive = tmp_path / "archive"
    settings = settings_for(stack, retention_runs_s=3600.0, archive_dir=str(archive))
    report = await sweep(client.bus, settings, only=mine)
    assert report.runs_purged == [] and report.runs_archived == [finished.run_id]  # archived when finished
    assert report.runs_kept_unfinished == 1
    assert (await client.state(finished.run_id)) is not None

    settings = settings_for(stack, retention_runs_s=0.0, retention_escalations_s=0.0, archive_dir=str(archive))
    report = await sweep(client.bus, settings, now=soon(), only=mine)
    assert report.runs_purged == [finished.run_id] and not report.errors
    # every record of the finished run is gone ...
    assert await client.state(finished.run_id) is None
    assert (await run_events(client.bus, finished.run_id))[0] == []
    for bucket in (S.KV_MODEL_CALLS, S.KV_TOOL_LEDGER, S.KV_SCRIPT_CURSORS):
        assert await prefixed_values(client.bus, bucket, finished.run_id) == {}, bucket
    verdicts = await client.bus.kv(S.KV_VERDICTS)
    assert await _missing(verdicts, S.kv_key(recorded.verdicts[0]["candidate_id"]))
    assert await _missing(await client.bus.kv(S.KV_BUDGETS), finished.run_id)
    # ... but its export still works, from the archive
    again = await export_run(client.bus, settings, finished.run_id)
    assert again.final_output == recorded.final_output and len(again.events) == len(recorded.events)

    # the waiting run keeps everything, its open queue item included (an open item never expires)
    state = await client.state(waits.run_id)
    assert state is not None and state.status == "awaiting_human"
    assert len((await run_events(client.bus, waits.run_id))[0]) > 5
    assert len(await escalations_of(client, waits.run_id)) == 1


async def test_a_sweep_purges_a_run_where_some_buckets_were_never_created(one_each: LocalStack) -> None:
    """A fresh deployment where no tool ever ran has no tool ledger bucket (nor cursors, nor verdicts):
    the sweep purges the run all the same, instead of failing on the missing bucket."""
    async with Client(settings_for(one_each)) as client:
        scenario = {"name": "no-tools", "task": "Say done.", "planner": [{"text": "done"}], "answer_mode": "text"}
        run_id = await client.submit_scenario(parse_scenario(scenario))
        assert (await client.wait(run_id, timeout=bound(30))).status == "completed"
        names = {i.config.name for i in await client.bus.js.streams_info()}
        assert f"KV_{S.KV_TOOL_LEDGER}" not in names  # no tool ever ran here
        report = await sweep(client.bus, settings_for(one_each, retention_runs_s=0.0), now=soon(), only={run_id})
        assert report.runs_purged == [run_id] and report.errors == [], report
        assert await client.state(run_id) is None


async def test_escalations_follow_their_own_retention(client: Client, stack: LocalStack) -> None:
    waits = await run_scenario(client, waiting(), until=("awaiting_human",))
    [item] = await escalations_of(client, waits.run_id)
    await client.claim(item.escalation_id, "alice")
    await client.resolve(item.escalation_id, "alice", "abort", note="not worth a retry")
    state = await client.wait(waits.run_id, timeout=bound(60))
    assert state.status == "stopped"

    # the run's records expire; the resolved item and its events (the audit trail) are kept
    settings = settings_for(stack, retention_runs_s=0.0, retention_escalations_s=3600.0)
    report = await sweep(client.bus, settings, now=soon(), only={waits.run_id})
    assert report.runs_purged == [waits.run_id] and report.escalations_purged == [], report
    assert await client.state(waits.run_id) is None
    left = (await run_events(client.bus, waits.run_id))[0]
    assert left and all(e.kind.startswith("escalation.") for e in left)
    esc = await client.bus.kv(S.KV_ESCALATIONS)
    assert not await _missing(esc, item.escalation_id)

    # past the audit retention they go too
    settings = settings_for(stack, retention_runs_s=0.0, retention_escalations_s=0.0)
    report = await sweep(client.bus, settings, now=soon(), only={waits.run_id})
    assert report.escalations_purged == [item.escalation_id]
    assert await _missing(esc, item.escalation_id)
    assert (await run_events(client.bus, waits.run_id))[0] == []


async def test_storage_per_run_is_bounded_and_returns_after_expiry(client: Client, stack: LocalStack) -> None:
    """Short form of `python -m bench --only storage`: bytes a run leaves, and that retention gives them back."""
    assert kv_history(S.KV_RUNS) == 1
    before = await stored(client)
    states = [await run_scenario(client, demo()) for _ in range(3)]
    after = await stored(client)
    grown = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    kv = await client.bus.kv(S.KV_RUNS)
    final_states = sum([len((await kv.get(s.run_id)).value or b"") for s in states])
    # one revision of the run state is kept: the bucket grows by about the final states, not 5x them
    assert grown[f"KV_{S.KV_RUNS}"] < final_states * 1.5, (grown, final_states)
    settings = settings_for(stack, retention_runs_s=0.0)
    report = await sweep(client.bus, settings, now=soon(), only={s.run_id for s in states})
    assert sorted(report.runs_purged) == sorted(s.run_id for s in states)
    swept = await stored(client)
    for name in (f"KV_{S.KV_RUNS}", f"KV_{S.KV_MODEL_CALLS}", f"KV_{S.KV_TOOL_LEDGER}", f"KV_{S.KV_VERDICTS}"):
        assert swept[name] <= before.get(name, 0) + grown[name] * 0.1, (
            name,
            before.get(name),
            grown[name],
            swept[name],
        )
    assert trajectory([]) == []


async def _missing(kv: Any, key: str) -> bool:
    try:
        entry = await kv.get(key)
    except Exception:
        return True
    return entry.value is None or entry.operation in ("DEL", "PURGE")


def test_record_model_round_trips() -> None:
    record = RunRecord.model_validate(
        json.loads(
            json.dumps(
                {
                    "run_id": "r",
                    "exported_at": "2026-01-01T00:00:00Z",
                    "task": "t",
                    "status": "completed",
                    "provider": "scripted",
                    "config": {"answer_mode": "auto", "terminal_tools": ["submit_result"]},
                }
            )
        )
    )
    assert record.format == "loopwarden.run-record"


async def test_handled_commands_are_purged_and_runs_go_on(client: Client) -> None:
    """Nothing reads an acknowledged command again: the sweep removes what every durable has handled."""
    done = await run_scenario(client, demo())
    assert done.status == "completed"
    below = await purge_handled_commands(client.bus)
    info = await client.bus.js.stream_info(S.STREAM_CMD)
    assert below > 0 and info.state.first_seq > below
    # a run submitted after the purge (and one in flight while it happens) completes as usual
    run_id = await client.submit_scenario(parse_scenario(demo()))
    await purge_handled_commands(client.bus)
    state = await client.wait(run_id, timeout=bound(60))
    assert state.status == "completed", state.final_reason


async def test_listing_keys_is_whole_while_keys_are_written_and_leaves_no_consumer(client: Client) -> None:
    """A listing by watching until nothing is pending came back a key short in about one listing in ten
    while other keys were written (the sweep then purged a run's audit trail as if it had no queue
    item); nats-py's KeyValue.keys() also left its consumer for 5 minutes (the soak hit the cap of
    1,000 consumers per stream). ``kv_keys`` reads the server's subject index: whole, no consumer."""
    bucket = "lw_test_listing_" + uuid.uuid4().hex[:8]
    kv = await client.bus.js.create_key_value(bucket=bucket, history=5)
    try:
        keys = [f"esc-run-{i:03d}-x" for i in range(200)]
        for key in keys:
            await kv.put(key, b"{}")
        writing = True

        async def write() -> None:
            n = 0
            while writing:
                await kv.put(keys[n % len(keys)], b"{}")
                n += 7
                await asyncio.sleep(0)

        writer = asyncio.create_task(write())
        try:
            short = [len(got) for _ in range(30) if len(got := await kv_keys(client.bus.nc, bucket)) != len(keys)]
        finally:
            writing = False
            await writer
        assert short == [], f"{len(short)} of 30 listings missed keys"
        assert sorted(await kv_keys(client.bus.nc, bucket)) == keys
        assert (await client.bus.js.stream_info(f"KV_{bucket}")).state.consumer_count == 0
    finally:
        await client.bus.js.delete_key_value(bucket)


async def _cli(stack: LocalStack, *args: str, **env: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "loopwarden.cli",
        *args,
        env={**{k: v for k, v in os.environ.items() if k != "NATS_URL"}, "LW_NATS_URL": stack.nats_url or "", **env},
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out = (await asyncio.wait_for(proc.communicate(), bound(120)))[0].decode()
    return proc.returncode or 0, out


async def test_export_and_retention_commands(client: Client, stack: LocalStack, tmp_path: Path) -> None:
    state = await run_scenario(client, demo())
    path = tmp_path / "run.json"
    code, out = await _cli(stack, "export", state.run_id, "-o", str(path))
    assert code == 0, out
    record = RunRecord.model_validate_json(path.read_text())
    assert record.run_id == state.run_id and record.status == "completed"
    code, out = await _cli(stack, "export", "run-never-submitted")
    assert code == 1 and "run run-never-submitted: no run state" in out
    code, out = await _cli(stack, "retention", LW_RETENTION_RUNS_S="-1")
    assert code == 2 and "invalid setting LW_RETENTION_RUNS_S" in out, out
    code, out = await _cli(stack, "retention", LW_RETENTION_RUNS_S="864000")  # nothing is ten days old
    assert code == 0 and "0 purged" in out, out
    assert await client.state(state.run_id) is not None


async def test_bootstrap_sets_the_kept_revisions_of_an_existing_bucket(client: Client) -> None:
    """A deployment bootstrapped before this change has buckets keeping five revisions: bootstrap cuts them."""
    js = client.bus.js
    await client.bus.kv(S.KV_DEMO)
    info = await js.stream_info(f"KV_{S.KV_DEMO}")
    await js.update_stream(info.config.evolve(max_msgs_per_subject=5))
    changed = await ensure_buckets(js, client.settings, [S.KV_DEMO], update=True)
    assert f"updated bucket {S.KV_DEMO} (history 5 -> 1)" in changed
    assert (await js.stream_info(f"KV_{S.KV_DEMO}")).config.max_msgs_per_subject == 1
    assert await ensure_buckets(js, client.settings, [S.KV_DEMO], update=True) == []


async def _submits_of(client: Client, run_id: str) -> list[int]:
    """The sequences of the messages LW_SUBMIT holds for ``run_id``."""
    held = await scan_all(client.bus.nc, S.STREAM_SUBMIT, [f"{S.RUN_SUBMIT_PREFIX}.>"])
    return [m.seq for m in held if (m.headers or {}).get(RUN_ID_HEADER) == run_id]


async def test_a_submit_leaves_the_submit_stream_once_its_run_is_recorded_and_a_resend_is_still_one_run(
    client: Client,
) -> None:
    """The planner removes a handled submit (``Intake.forget``): the run's record and its bound scenario hold
    what the run needs. Its message id stays in LW_SUBMIT's window: the same submit sent again is dropped by the
    server, and the run is the one recorded."""
    submit = scenario_submit(parse_scenario(demo()), "run-forget-" + uuid.uuid4().hex[:8])
    await client.submit(submit)
    done = await client.wait(submit.run_id, timeout=bound(60))
    assert done.status == "completed", done.final_reason
    for _ in range(polls(50)):  # removed in the background once the submit was handled
        if not await _submits_of(client, submit.run_id):
            break
        await asyncio.sleep(0.1)
    assert await _submits_of(client, submit.run_id) == []
    scenario = await (await client.bus.kv(S.KV_SCENARIOS)).get(submit.run_id)
    assert scenario.value and json.loads(scenario.value)["name"] == demo()["name"]
    await client.send(submit)  # the same message id: the server drops it
    await asyncio.sleep(bound(0.5))
    assert await _submits_of(client, submit.run_id) == []
    again = await client.wait(submit.run_id, timeout=bound(60))
    assert again.status == "completed" and again.model_calls == done.model_calls


async def test_a_finished_runs_commands_leave_lw_cmd_but_the_executors_results(one_client: Client) -> None:
    """The planner removes the commands it published for a run (its advance, tool calls, judge request) once the
    run ended and each was handled (``SentCommands``); the run's export and replay still have every call's
    arguments and raw output (events and the executor's ledger). What stays are the executor's results for the
    validator, which the retention sweep removes. One planner replica here: with several, each removes what it
    published (the rest stays until the sweep)."""
    client = one_client
    done = await run_scenario(client, demo())
    assert done.status == "completed"
    held: list[str] = []
    for _ in range(polls(50)):
        stored = await scan_all(client.bus.nc, S.STREAM_CMD, [f"{S.P}.cmd.>"])
        held = sorted(m.subject for m in stored if (m.headers or {}).get(RUN_ID_HEADER) == done.run_id)
        if held == [S.RESULT_VALIDATE] * 3:
            break
        await asyncio.sleep(0.1)
    assert held == [S.RESULT_VALIDATE] * 3, held
    record = await export_run(client.bus, client.settings, done.run_id)
    assert all(c.arguments and c.has_output for c in record.tool_calls) and len(record.tool_calls) == 3
    report = await replay(client, record)
    assert report.same, report.lines()
