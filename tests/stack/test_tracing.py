"""A run is one trace across all six services (spans collected over real OTLP/HTTP)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from loopwarden.client import Client
from shared import subjects as S
from shared.messages import escalation_id_for_call
from shared.scenario import parse_scenario
from shared.settings import Settings
from shared.telemetry import setup_telemetry
from tests.support.otlp_collector import OtlpCollector
from tests.support.runs import escalations_of
from tests.support.timing import bound
from tests.support.tracing import spans_of_run

SERVICES = {f"loopwarden-{s}" for s in ("planner", "executor", "validator", "judge", "governor", "escalation")}

SCENARIO = {
    "name": "touches-every-service",
    "task": "Charge the order, then confirm.",
    "planner": [
        {
            "text": "Charging.",
            "tool_calls": [
                {"name": "sql_query", "id": "toolu_q1", "input": {"query": "select * from orders where id = 1001"}}
            ],
        },
        {"tool_calls": [{"name": "submit_result", "input": {"answer": "Order 1001 is handled by a human."}}]},
    ],
    "judge": [{"scores": {"clear": 0.9}}],
    "tools": {"sql_query": [{"fail": "fatal", "error": "permission denied for table orders"}]},
    "rubric": {"threshold": 0.5, "criteria": [{"name": "clear"}]},
}


GENAI_SCENARIO = {
    "name": "genai-conventions",
    "task": "What is 6*7?",
    "planner": [
        {"tool_calls": [{"name": "calculator", "id": "toolu_calc1", "input": {"expression": "6*7"}}]},
        {"tool_calls": [{"name": "submit_result", "input": {"answer": "42"}}]},
    ],
    "judge": [{"scores": {"correct": 1.0}}],
    "rubric": {"threshold": 0.5, "criteria": [{"name": "correct"}]},
}


async def test_one_run_is_one_trace_across_all_six_services(client: Client, otlp: OtlpCollector) -> None:
    run_id = await client.submit_scenario(parse_scenario(SCENARIO))
    state = await client.wait(run_id, timeout=bound(60), until=("awaiting_human",))
    esc_id = escalation_id_for_call(run_id, 1, "toolu_q1")
    items = await escalations_of(client, run_id)  # raised by the escalation service from its subscription
    assert [e.escalation_id for e in items] == [esc_id]
    assert (await client.resolve(esc_id, "oncall", "resume", "charged manually")).ok
    state = await client.wait(run_id, timeout=bound(60))
    assert state.status == "completed", state.final_reason

    spans = await spans_of_run(otlp, client, run_id, SERVICES | {"loopwarden-client"})
    trace_id = spans[0].trace_id
    # nothing of this run escaped into another trace
    tagged = [s for s in otlp.spans if s.attributes.get("loopwarden.run.id") == run_id]
    assert tagged and {s.trace_id for s in tagged} == {trace_id}
    # messaging spans on both sides of the bus, and a consumer span for the human's resolution
    names = {s.name for s in spans}
    assert any(n.startswith("lw.v1.cmd.tool.execute.sql_query") for n in names)
    assert any(n.startswith("lw.v1.evt.escalation.resolved") for n in names)
    # model-call spans carry the GenAI attributes
    chats = [s for s in spans if s.name.startswith("chat ")]
    assert chats
    for span in chats:
        assert span.attributes["gen_ai.request.model"]
        assert span.attributes["gen_ai.usage.input_tokens"] > 0
        assert span.attributes["gen_ai.usage.output_tokens"] > 0
        assert span.attributes["gen_ai.operation.name"] == "chat"


# --- OpenTelemetry conventions (issue 13): read back from the OTLP receiver ------------------------


def _is_uuid(value: object) -> bool:
    try:
        uuid.UUID(str(value))
    except ValueError:
        return False
    return True


async def test_run_spans_follow_the_genai_conventions(client: Client, otlp: OtlpCollector) -> None:
    run_id = await client.submit_scenario(parse_scenario(GENAI_SCENARIO))
    state = await client.wait(run_id, timeout=bound(60))
    assert state.status == "completed", state.final_reason
    spans = await spans_of_run(otlp, client, run_id, {"loopwarden-planner", "loopwarden-executor"})
    trace_id = spans[0].trace_id
    want = {"invoke_agent loopwarden", "execute_tool calculator", "execute_tool submit_result"}
    for _ in range(int(bound(100))):  # replicas export in batches: wait until every span asserted on is in
        spans = otlp.trace(trace_id)
        chats = [s for s in spans if s.name.startswith("chat ")]
        ids = {s.span_id for s in spans}
        parents = {s.parent_id for s in spans if s.name == "invoke_agent loopwarden"}
        # two planner turns and the judge; the agent's parent (the submit's span, exported in another batch)
        if want <= {s.name for s in spans} and len(chats) >= 3 and parents <= ids:
            break
        await asyncio.sleep(0.1)
    agents = [s for s in spans if s.name == "invoke_agent loopwarden"]
    by_id = {s.span_id: s for s in spans}

    # one invoke_agent span per run, spanning the run, under the submit
    assert len(agents) == 1, [s.name for s in spans]
    agent = agents[0]
    assert agent.service == "loopwarden-planner"
    assert agent.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert agent.attributes["gen_ai.agent.name"] == "loopwarden"
    assert agent.attributes["gen_ai.agent.id"] == run_id
    assert agent.attributes["gen_ai.conversation.id"] == run_id
    assert agent.attributes["gen_ai.usage.input_tokens"] == state.usage.input_tokens > 0
    assert agent.attributes["loopwarden.run.status"] == "completed"
    assert agent.parent_id in by_id and by_id[agent.parent_id].name.startswith(S.RUN_SUBMIT_PREFIX)
    chats = [s for s in spans if s.name.startswith("chat ")]
    tools = [s for s in spans if s.name.startswith("execute_tool ")]
    assert chats and tools
    assert agent.start_ns <= min(s.start_ns for s in chats + tools)
    assert agent.end_ns >= max(s.end_ns for s in chats + tools)

    # execute_tool spans: one per call, named and tagged per the conventions
    calc = [s for s in tools if s.attributes["gen_ai.tool.name"] == "calculator"]
    assert [s.name for s in calc] == ["execute_tool calculator"]
    assert calc[0].attributes["gen_ai.operation.name"] == "execute_tool"
    assert calc[0].attributes["gen_ai.tool.call.id"] == "toolu_calc1"
    assert calc[0].attributes["gen_ai.tool.type"] == "function"

    # model calls carry the response id
    for span in chats:
        assert span.attributes["gen_ai.response.id"].startswith("scripted_"), span.attributes
    plan_ids = {s.attributes["gen_ai.response.id"] for s in chats if s.attributes["loopwarden.model.purpose"] == "plan"}
    assert plan_ids == {f"scripted_plan_{run_id}_0", f"scripted_plan_{run_id}_1"}

    # every process has its own service.instance.id (a UUID), and the resource names its service
    for span in spans:
        assert span.resource["service.namespace"] == "loopwarden"
        assert _is_uuid(span.resource["service.instance.id"]), span.resource


async def test_replicas_have_distinct_instance_ids(client: Client, otlp: OtlpCollector) -> None:
    """Two planner and two executor replicas run in the test stack: each its own instance id (a
    replica restarted by an earlier test is one more), never the service name and a pid."""

    def instances(service: str) -> set[str]:
        return {str(s.resource["service.instance.id"]) for s in list(otlp.spans) if s.service == service}

    for _ in range(10):
        if all(len(instances(s)) >= 2 for s in ("loopwarden-planner", "loopwarden-executor")):
            break
        # several runs at once: the shared durable consumers hand their messages to both replicas
        ids = await asyncio.gather(*(client.submit_scenario(parse_scenario(GENAI_SCENARIO)) for _ in range(6)))
        await asyncio.gather(*(client.wait(i, timeout=bound(60)) for i in ids))
        await asyncio.sleep(bound(1.0))
    for service in ("loopwarden-planner", "loopwarden-executor"):
        found = instances(service)
        assert len(found) >= 2, (service, found)
        assert all(_is_uuid(i) for i in found), found
    assert not instances("loopwarden-planner") & instances("loopwarden-executor")


async def test_genai_metrics_have_the_semantic_convention_names(client: Client, otlp: OtlpCollector) -> None:
    run_id = await client.submit_scenario(parse_scenario(GENAI_SCENARIO))
    assert (await client.wait(run_id, timeout=bound(60))).status == "completed"

    def points(service: str, metric: str) -> list[dict[str, Any]]:
        return list(otlp.metrics.get((service, metric), []))

    want = (
        ("loopwarden-planner", "gen_ai.client.token.usage"),
        ("loopwarden-planner", "gen_ai.client.operation.duration"),
        ("loopwarden-judge", "gen_ai.client.token.usage"),
        ("loopwarden-judge", "gen_ai.client.operation.duration"),
    )
    for _ in range(int(bound(120))):  # metrics are exported every 5 s
        if all(points(*w) for w in want):
            break
        await asyncio.sleep(0.25)
    for service in ("loopwarden-planner", "loopwarden-judge"):
        usage = points(service, "gen_ai.client.token.usage")
        assert {p["gen_ai.token.type"] for p in usage} == {"input", "output"}, usage[:2]
        for p in usage:
            assert p["gen_ai.operation.name"] == "chat"
            assert p["gen_ai.provider.name"]
            assert p["gen_ai.request.model"]
            assert p["_count"] >= 1 and p["_sum"] > 0
        duration = points(service, "gen_ai.client.operation.duration")
        assert all(p["_count"] >= 1 and p["_sum"] >= 0 and p["gen_ai.request.model"] for p in duration)
    assert not points("loopwarden-planner", "gen_ai.client.token.usage.total")  # the old, non-standard name


async def test_standard_resource_variables_are_honoured(otlp: OtlpCollector, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "lw-planner-eu1")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment.name=staging,k8s.pod.name=planner-7f9c")
    telemetry = setup_telemetry("planner", Settings(otel_exporter_otlp_endpoint=otlp.endpoint))
    other = setup_telemetry("planner", Settings(otel_exporter_otlp_endpoint=otlp.endpoint))
    marker = uuid.uuid4().hex
    try:
        for t in (telemetry, other):
            with t.tracer("test").start_as_current_span(f"resource probe {marker}"):
                pass
            t.tracer_provider.force_flush()
        for _ in range(int(bound(50))):
            probes = [s for s in list(otlp.spans) if s.name == f"resource probe {marker}"]
            if len(probes) == 2:
                break
            await asyncio.sleep(0.1)
    finally:
        telemetry.shutdown()
        other.shutdown()
    assert len(probes) == 2
    for span in probes:
        assert span.service == "lw-planner-eu1"  # OTEL_SERVICE_NAME wins over our default
        assert span.resource["deployment.environment.name"] == "staging"
        assert span.resource["k8s.pod.name"] == "planner-7f9c"
        assert span.resource["service.namespace"] == "loopwarden"  # our defaults stay where unset
    assert probes[0].resource["service.instance.id"] != probes[1].resource["service.instance.id"]
