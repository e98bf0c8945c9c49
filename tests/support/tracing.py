"""Reading one run's trace from the test OTLP collector."""

from __future__ import annotations

import asyncio

from loopwarden.client import Client
from tests.support.otlp_collector import CollectedSpan, OtlpCollector
from tests.support.timing import polls


async def spans_of_run(otlp: OtlpCollector, client: Client, run_id: str, want: set[str]) -> list[CollectedSpan]:
    """The spans of the run's trace once every service in ``want`` has exported into it."""
    assert client.telemetry is not None
    client.telemetry.tracer_provider.force_flush()
    for _ in range(polls(100)):
        roots = [s for s in otlp.spans if s.name == f"run {run_id}"]
        if roots:
            spans = otlp.trace(roots[0].trace_id)
            if want <= {s.service for s in spans}:
                return spans
        await asyncio.sleep(0.1)
    roots = [s for s in otlp.spans if s.name == f"run {run_id}"]
    got = {s.service for s in otlp.trace(roots[0].trace_id)} if roots else set()
    raise AssertionError(f"services in the run's trace: {sorted(got)}; missing {sorted(want - got)}")
