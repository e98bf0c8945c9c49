"""Agents as pure functions: a file read into a definition, the version a registration stores, what the
planner makes of a submit naming an agent (services/planner/admission.resolve_agent, with_agent), and
`loopwarden runs`' selection."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from loopwarden.cli_agents import duration
from loopwarden.client import select_runs
from loopwarden.generate.files import render
from services.planner.admission import Refused, resolve_agent, with_agent
from services.planner.turns import resolve_config
from shared.agents import AgentError, load_agent, next_record, parse_agent
from shared.messages import Agent, AgentRecord, Criterion, IterationView, Rubric, RunLimits, RunSnapshot, RunSubmit
from shared.settings import Settings

ROOT = Path(__file__).resolve().parents[2]

RESTOCK = Agent(
    name="restock",
    instructions="You keep the warehouse stocked. Never reorder more than 500 units.",
    model="claude-haiku-4-5",
    provider="anthropic",
    tools=["low_stock"],
    answer_mode="submit",
    rubric=Rubric(criteria=[Criterion(name="cites skus", description="names every SKU it reorders")], threshold=0.8),
    limits=RunLimits(max_iterations=4, cost_ceiling_usd=0.2),
    tenants=["default", "acme"],
)


def record(agent: Agent = RESTOCK, version: int = 3) -> AgentRecord:
    return AgentRecord(agent=agent, version=version, digest="0" * 64)


def submit(**kw: object) -> RunSubmit:
    return RunSubmit(run_id="run-a1", task="What should we reorder?", agent="restock", tenant="default", **kw)  # type: ignore[arg-type]


def test_a_submit_naming_an_agent_gets_its_definition_and_keeps_its_task() -> None:
    got = resolve_agent(submit(tools=["payments"], answer_mode="text"), record(), "anthropic")
    assert got.task == "What should we reorder?" and got.tenant == "default"
    assert got.tools == ["low_stock"] and got.answer_mode == "submit"  # the agent's, not the submit's
    assert got.rubric == RESTOCK.rubric and got.limits == RESTOCK.limits


def test_the_run_config_carries_the_agents_instructions_model_name_and_version() -> None:
    s = resolve_agent(submit(), record(), "anthropic")
    settings = Settings(planner_model="claude-sonnet-4-5")
    config = with_agent(resolve_config(s, settings, {}), record())
    assert config.instructions.startswith("You keep the warehouse stocked")
    assert (config.model, config.agent, config.agent_version) == ("claude-haiku-4-5", "restock", 3)
    assert config.max_iterations == 4 and config.cost_ceiling_usd == 0.2 and config.allowed_tools == ["low_stock"]
    plain = with_agent(resolve_config(s, settings, {}), None)
    assert (plain.model, plain.agent, plain.instructions) == ("claude-sonnet-4-5", None, "")


def test_an_agent_without_a_model_keeps_the_stacks() -> None:
    bare = record(Agent(name="restock"))
    config = with_agent(resolve_config(resolve_agent(submit(), bare, "scripted"), Settings(), {}), bare)
    assert config.model == Settings().planner_model


@pytest.mark.parametrize(
    ("rec", "tenant", "provider", "scenario", "reason"),
    [
        (None, "default", "anthropic", None, "agent 'restock' is not registered"),
        (record(), "globex", "anthropic", None, "agent 'restock' is not for tenant 'globex' (it is for default, acme)"),
        (record(), "default", "openai", None, "agent 'restock' needs the anthropic provider; this planner's is openai"),
    ],
)
def test_a_submit_the_agent_does_not_allow_is_refused_in_one_line(
    rec: AgentRecord | None, tenant: str, provider: str, scenario: dict[str, object] | None, reason: str
) -> None:
    with pytest.raises(Refused, match="^" + reason.replace("(", r"\(").replace(")", r"\)")) as err:
        resolve_agent(submit().model_copy(update={"tenant": tenant, "scenario": scenario}), rec, provider)
    assert "\n" not in str(err.value)


def test_a_scripted_run_of_an_agent_is_replayed_whatever_provider_it_names() -> None:
    got = resolve_agent(submit().model_copy(update={"scenario": {"task": "x"}}), record(), "scripted")
    assert got.tools == ["low_stock"]


def test_a_submit_without_an_agent_is_unchanged() -> None:
    s = RunSubmit(run_id="run-a2", task="t", tools=["x"])
    assert resolve_agent(s, None, "scripted") is s


def test_registering_a_changed_definition_stores_the_next_version_and_the_same_one_nothing() -> None:
    first = next_record(None, RESTOCK)
    assert first is not None and first.version == 1
    assert next_record(first, RESTOCK) is None
    second = next_record(first, RESTOCK.model_copy(update={"instructions": "Reorder in dozens."}))
    assert second is not None and second.version == 2 and second.digest != first.digest


def test_an_agent_file_is_read_and_a_bad_one_named_by_field(tmp_path: Path) -> None:
    good = tmp_path / "restock.yaml"
    good.write_text("name: restock\ninstructions: Keep stock.\ntools: [low_stock]\nlimits: {max_iterations: 3}\n")
    agent = load_agent(good)
    assert agent.tools == ["low_stock"] and agent.limits.max_iterations == 3
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: re stock\nanswer_mode: maybe\ntool: [x]\n")
    with pytest.raises(AgentError) as err:
        load_agent(bad)
    text = str(err.value)
    assert str(bad) in text and "name:" in text and "answer_mode:" in text and "tool:" in text  # typo: extra key
    with pytest.raises(AgentError, match="cannot read agent"):
        load_agent(tmp_path / "missing.yaml")
    assert parse_agent(RESTOCK) is RESTOCK


def test_the_agent_schema_is_generated_from_the_model() -> None:
    assert (ROOT / "schemas" / "agent.json").read_text() == render("agent.json"), "run `make schemas`"


def _snap(
    run_id: str, minutes_ago: float, status: str = "completed", agent: str | None = None, tenant: str = "default"
) -> RunSnapshot:
    at = datetime(2026, 1, 1, 12, 0, tzinfo=UTC) - timedelta(minutes=minutes_ago)
    return RunSnapshot(
        run_id=run_id,
        task="t",
        status=status,
        created_at=at,
        iteration=IterationView(n=1),
        agent=agent,
        tenant=tenant,  # type: ignore[arg-type]
    )


def test_runs_are_selected_by_every_filter_newest_first_and_paged() -> None:
    now = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    runs = [
        _snap("run-old", 300, agent="restock"),
        _snap("run-new", 1, agent="restock"),
        _snap("run-mid", 30, status="failed", agent="restock", tenant="acme"),
        _snap("run-other", 2, agent=None),
    ]
    ids = lambda rs: [r.run_id for r in rs]  # noqa: E731
    assert ids(select_runs(runs, now=now)) == ["run-new", "run-other", "run-mid", "run-old"]
    assert ids(select_runs(runs, agent="restock", now=now)) == ["run-new", "run-mid", "run-old"]
    assert ids(select_runs(runs, status="failed", now=now)) == ["run-mid"]
    assert ids(select_runs(runs, tenant="acme", now=now)) == ["run-mid"]
    assert ids(select_runs(runs, since=timedelta(hours=1), now=now)) == ["run-new", "run-other", "run-mid"]
    assert ids(select_runs(runs, limit=2, offset=1, now=now)) == ["run-other", "run-mid"]


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("90s", 90), ("5m", 300), ("1h", 3600), ("2d", 172800)])
def test_ages_are_written_as_the_console_writes_them(text: str, seconds: float) -> None:
    assert duration(text).total_seconds() == seconds
