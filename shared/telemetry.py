"""The one telemetry setup: a tracer and meter provider per process, OTLP when configured.

Span and attribute names follow the OpenTelemetry messaging and GenAI semantic
conventions; the names live here as constants rather than as strings in handlers.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from opentelemetry import metrics as otel_metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import NoOpTracer, Tracer

from shared.settings import Settings

# GenAI semantic conventions (gen_ai.*)
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID = "gen_ai.tool.call.id"
GEN_AI_CONVERSATION_ID = "gen_ai.conversation.id"
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS = "gen_ai.usage.cache_read.input_tokens"
GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS = "gen_ai.usage.cache_creation.input_tokens"
LW_COST_USD = "loopwarden.cost.usd"
ERROR_TYPE = "error.type"

# Loopwarden's own attributes
LW_RUN_ID = "loopwarden.run.id"
LW_ITERATION = "loopwarden.iteration"
LW_FAILURE_TYPE = "loopwarden.failure.type"
LW_ATTEMPT = "loopwarden.tool.attempt"
LW_BACKOFF_S = "loopwarden.tool.backoff_s"
LW_VERDICT = "loopwarden.judge.status"
LW_SCORE = "loopwarden.judge.score"
LW_BUDGET_ACTION = "loopwarden.budget.action"


@dataclass
class Telemetry:
    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    exporting: bool = True  # False: no span goes anywhere, so none is made (no-op tracers)

    def tracer(self, name: str) -> Tracer:
        if not self.exporting:
            return NoOpTracer()
        return self.tracer_provider.get_tracer(name)

    @property
    def bus_tracer_provider(self) -> TracerProvider | None:
        """What the bus traces messages with: nothing when no span is exported."""
        return self.tracer_provider if self.exporting else None

    def meter(self, name: str) -> otel_metrics.Meter:
        return self.meter_provider.get_meter(name)

    def shutdown(self) -> None:
        for shut in (self.tracer_provider.force_flush, self.tracer_provider.shutdown, self.meter_provider.shutdown):
            try:
                shut()
            except Exception:  # pragma: no cover - exporter gone at exit
                logging.getLogger("loopwarden").debug("telemetry shutdown", exc_info=True)


def setup_telemetry(
    service: str,
    settings: Settings,
    *,
    span_exporter: SpanExporter | None = None,
    metric_reader: MetricReader | None = None,
) -> Telemetry:
    """Build providers for ``service``; export OTLP/HTTP when an endpoint is configured.

    Providers are passed explicitly to the bus and to our own spans rather than installed
    globally, so tests can build several in one process. With no exporter configured no span
    is made at all (like ``OTEL_SDK_DISABLED``): tracers are no-ops and the bus skips tracing.
    """
    resource = Resource.create(
        {
            "service.name": f"loopwarden-{service}",
            "service.namespace": "loopwarden",
            "service.instance.id": f"{service}-{os.getpid()}",
        }
    )
    tracer_provider = TracerProvider(resource=resource)
    readers: list[MetricReader] = [metric_reader] if metric_reader else []
    endpoint = settings.otel_exporter_otlp_endpoint
    if endpoint:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        base = endpoint.rstrip("/")
        tracer_provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{base}/v1/traces"), schedule_delay_millis=500)
        )
        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=f"{base}/v1/metrics"), 5000))
    if span_exporter is not None:
        tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter, schedule_delay_millis=200))
    meter_provider = MeterProvider(resource=resource, metric_readers=readers)
    return Telemetry(tracer_provider, meter_provider, exporting=bool(endpoint) or span_exporter is not None)
