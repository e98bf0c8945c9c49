"""The one telemetry setup: a tracer and meter provider per process, OTLP when configured.

Span and attribute names follow the OpenTelemetry messaging and GenAI semantic
conventions; the names live here as constants rather than as strings in handlers.

The resource honours the standard variables: ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES`` (read by the SDK's resource detectors, and winning over our
defaults), ``OTEL_EXPERIMENTAL_RESOURCE_DETECTORS``; every process gets its own
``service.instance.id`` (a UUID: replicas in containers all run as pid 1).

Metrics go out two ways at once, from the same instruments: OTLP (pushed every 5 s, when an endpoint is
configured) and Prometheus text on the health port's ``/metrics`` (the SDK's ``PrometheusMetricReader``
registered with a registry of this process's own, served by ``shared/health.py``; no second HTTP port).
Metric names are constants in ``shared/metrics.py``.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime

from opentelemetry import metrics as otel_metrics
from opentelemetry import propagate
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import NoOpTracer, SpanKind, Status, StatusCode, Tracer
from prometheus_client import CollectorRegistry, generate_latest

from shared import metrics as M
from shared.settings import Settings
from shared.version import package_version

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
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_AGENT_NAME = "gen_ai.agent.name"
GEN_AI_AGENT_ID = "gen_ai.agent.id"
GEN_AI_AGENT_DESCRIPTION = "gen_ai.agent.description"
GEN_AI_TOOL_TYPE = "gen_ai.tool.type"
GEN_AI_TOOL_DESCRIPTION = "gen_ai.tool.description"
GEN_AI_TOKEN_TYPE = "gen_ai.token.type"
GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS = "gen_ai.usage.cache_read.input_tokens"
GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS = "gen_ai.usage.cache_creation.input_tokens"
LW_COST_USD = "loopwarden.cost.usd"
ERROR_TYPE = "error.type"
# gen_ai.operation.name values
OP_CHAT = "chat"
OP_INVOKE_AGENT = "invoke_agent"
OP_EXECUTE_TOOL = "execute_tool"
AGENT_NAME = "loopwarden"
# GenAI semantic-convention metrics (histograms)
METRIC_TOKEN_USAGE = M.GEN_AI_TOKEN_USAGE
METRIC_OPERATION_DURATION = M.GEN_AI_OPERATION_DURATION

# Loopwarden's own attributes
LW_RUN_ID = "loopwarden.run.id"
LW_ITERATION = "loopwarden.iteration"
LW_RUN_STATUS = "loopwarden.run.status"
LW_FAILURE_TYPE = "loopwarden.failure.type"
LW_ATTEMPT = "loopwarden.tool.attempt"
LW_BACKOFF_S = "loopwarden.tool.backoff_s"
LW_UNDECLARED_FIELDS = "loopwarden.tool.undeclared_fields"  # JSON pointers of the fields a call invented
LW_UNDECLARED_OUTCOME = "loopwarden.tool.undeclared_outcome"  # refused, stripped or kept
LW_VERDICT = "loopwarden.judge.status"
LW_SCORE = "loopwarden.judge.score"
LW_BUDGET_ACTION = "loopwarden.budget.action"
LW_RATELIMIT_WAIT_S = "loopwarden.ratelimit.wait_s"  # a model call's wait for its key's rate limit, so far
LW_RATELIMIT_ACCOUNT = "loopwarden.ratelimit.account"  # a provider key, as a short hash (never the key)


class GenAiMetrics:
    """``gen_ai.client.token.usage`` and ``gen_ai.client.operation.duration``, per the GenAI
    semantic conventions (histograms; attributes gen_ai.operation.name, gen_ai.provider.name,
    gen_ai.request.model, gen_ai.response.model, gen_ai.token.type, error.type)."""

    def __init__(self, meter: otel_metrics.Meter) -> None:
        # the conventions' names, units and descriptions, with the bucket boundaries they recommend
        self.token_usage = meter.create_histogram(
            M.GEN_AI_TOKEN_USAGE,
            unit="{token}",
            description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=M.TOKEN_BUCKETS,
        )
        self.duration = meter.create_histogram(
            M.GEN_AI_OPERATION_DURATION,
            unit="s",
            description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=M.DURATION_BUCKETS_S,
        )

    def record(
        self,
        *,
        provider: str,
        request_model: str,
        duration_s: float,
        response_model: str = "",
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        error_type: str | None = None,
        operation: str = OP_CHAT,
    ) -> None:
        attrs: dict[str, str] = {
            GEN_AI_OPERATION_NAME: operation,
            GEN_AI_PROVIDER_NAME: provider,
            GEN_AI_REQUEST_MODEL: request_model,
        }
        if response_model:
            attrs[GEN_AI_RESPONSE_MODEL] = response_model
        self.duration.record(duration_s, {**attrs, ERROR_TYPE: error_type} if error_type else attrs)
        if input_tokens is not None:
            self.token_usage.record(input_tokens, {**attrs, GEN_AI_TOKEN_TYPE: "input"})
        if output_tokens is not None:
            self.token_usage.record(output_tokens, {**attrs, GEN_AI_TOKEN_TYPE: "output"})


def current_traceparent() -> str:
    """The W3C ``traceparent`` of the current span ("" when nothing is traced)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get("traceparent", "")


def record_invoke_agent(
    tracer: Tracer,
    *,
    run_id: str,
    started_at: datetime,
    traceparent: str,
    status: str,
    model: str,
    input_tokens: int,
    output_tokens: int,
    iterations: int,
    reason: str | None = None,
) -> None:
    """The run's ``invoke_agent`` span (GenAI conventions), recorded when the run ends: from the
    run's start to now, under the span that started it (``traceparent``), so it spans every
    model call, tool call and human wait of the run, whichever replicas handled them."""
    parent = propagate.extract({"traceparent": traceparent}) if traceparent else None
    span = tracer.start_span(
        f"{OP_INVOKE_AGENT} {AGENT_NAME}",
        context=parent,
        kind=SpanKind.INTERNAL,
        start_time=int(started_at.timestamp() * 1e9),
        attributes={
            GEN_AI_OPERATION_NAME: OP_INVOKE_AGENT,
            GEN_AI_AGENT_NAME: AGENT_NAME,
            GEN_AI_AGENT_ID: run_id,
            GEN_AI_AGENT_DESCRIPTION: "a Loopwarden tool loop: planner, executor, validator, judge, governor",
            GEN_AI_CONVERSATION_ID: run_id,
            GEN_AI_REQUEST_MODEL: model,
            GEN_AI_USAGE_INPUT_TOKENS: input_tokens,
            GEN_AI_USAGE_OUTPUT_TOKENS: output_tokens,
            LW_RUN_ID: run_id,
            LW_ITERATION: iterations,
            LW_RUN_STATUS: status,
        },
    )
    if status == "failed":
        span.set_attribute(ERROR_TYPE, "run_failed")
        span.set_status(Status(StatusCode.ERROR, reason or "failed"))
    span.end()


def service_resource(service: str) -> Resource:
    """Our defaults, then the standard resource detectors (``OTEL_RESOURCE_ATTRIBUTES``,
    ``OTEL_SERVICE_NAME``, ``OTEL_EXPERIMENTAL_RESOURCE_DETECTORS``) over them: what an operator
    sets wins. ``service.instance.id`` is a fresh UUID per process unless set."""
    defaults = {
        "service.name": f"loopwarden-{service}",
        "service.namespace": "loopwarden",
        "service.version": package_version(),
        "service.instance.id": str(uuid.uuid4()),
    }
    return Resource.create(defaults).merge(OTELResourceDetector().detect())


SCRAPE_MIN_INTERVAL_S = 1.0  # scrapes closer together than this get the last answer again (no new collection)
# On every series: which service it comes from (Prometheus adds the job and instance of the scrape)
PROMETHEUS_RESOURCE_LABELS = frozenset({"service.name"})


@dataclass
class Telemetry:
    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    exporting: bool = True  # False: no span goes anywhere, so none is made (no-op tracers)
    _gen_ai: GenAiMetrics | None = field(default=None, repr=False)
    registry: CollectorRegistry | None = field(default=None, repr=False)  # the Prometheus reader's, when there is one
    _scraped: tuple[float, bytes] = field(default=(0.0, b""), repr=False)

    def prometheus_text(self) -> bytes:
        """Every metric of this process in the Prometheus text format (``/metrics``). A scrape storm costs one
        collection per ``SCRAPE_MIN_INTERVAL_S``; what is collected is what the process holds in memory (the
        JetStream figures are polled in the background, ``shared/jetstream_gauges.py``)."""
        if self.registry is None:
            return b""
        at, text = self._scraped
        now = time.monotonic()
        if not text or now - at >= SCRAPE_MIN_INTERVAL_S:
            text = generate_latest(self.registry)
            self._scraped = (now, text)
        return text

    @property
    def gen_ai(self) -> GenAiMetrics:
        """The GenAI client metrics of this process (one set, shared by its model calls)."""
        if self._gen_ai is None:
            self._gen_ai = GenAiMetrics(self.meter("loopwarden.gen_ai"))
        return self._gen_ai

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
    prometheus: bool | None = None,
) -> Telemetry:
    """Build providers for ``service``; export OTLP/HTTP when an endpoint is configured, and keep the
    Prometheus text of its metrics when ``prometheus`` (default: when a health port will serve it).

    Providers are passed explicitly to the bus and to our own spans rather than installed
    globally, so tests can build several in one process. With no exporter configured no span
    is made at all (like ``OTEL_SDK_DISABLED``): tracers are no-ops and the bus skips tracing.
    """
    resource = service_resource(service)
    tracer_provider = TracerProvider(resource=resource)
    readers: list[MetricReader] = [metric_reader] if metric_reader else []
    registry = None
    if prometheus if prometheus is not None else settings.health_port is not None:
        registry = CollectorRegistry(auto_describe=False)  # this process's own, not the module-global REGISTRY
        readers.append(
            PrometheusMetricReader(
                scope_info_enabled=False,  # no otel_scope_* labels: a metric's name says where it comes from
                resource_attribute_filter=PROMETHEUS_RESOURCE_LABELS.__contains__,
                registry=registry,
            )
        )
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
    exporting = bool(endpoint) or span_exporter is not None
    return Telemetry(tracer_provider, meter_provider, exporting=exporting, registry=registry)
