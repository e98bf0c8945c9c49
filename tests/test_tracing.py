"""A run is one trace across all six services (spans collected over real OTLP/HTTP)."""

from __future__ import annotations

from loopwarden.client import Client
from shared.messages import escalation_id_for_call
from shared.scenario import parse_scenario
from tests.conftest import escalations_of
from tests.support.otlp_collector import OtlpCollector
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


async def test_one_run_is_one_trace_across_all_six_services(client: Client, otlp: OtlpCollector) -> None:
    run_id = await client.submit_scenario(parse_scenario(SCENARIO))
    state = await client.wait(run_id, until=("awaiting_human",))
    esc_id = escalation_id_for_call(run_id, 1, "toolu_q1")
    items = await escalations_of(client, run_id)  # raised by the escalation service from its subscription
    assert [e.escalation_id for e in items] == [esc_id]
    assert (await client.resolve(esc_id, "oncall", "resume", "charged manually")).ok
    state = await client.wait(run_id)
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
