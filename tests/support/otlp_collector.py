"""A minimal OTLP/HTTP receiver: the services export real spans to it, as they would to Jaeger."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.support.http_server import LocalHttpServer, QuietHandler


@dataclass(frozen=True)
class CollectedSpan:
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    service: str
    attributes: dict[str, Any]
    resource: dict[str, Any] = field(default_factory=dict, compare=False)
    kind: int = 0  # the OTLP SpanKind number (1 internal, 2 server, 3 client, 4 producer, 5 consumer)
    start_ns: int = 0
    end_ns: int = 0


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


class OtlpCollector(LocalHttpServer):
    def __init__(self) -> None:
        self.spans: list[CollectedSpan] = []
        self.metrics: dict[tuple[str, str], list[dict[str, Any]]] = {}  # (service, metric) -> points' attributes
        self._lock = threading.Lock()
        collector = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.path.endswith("/v1/traces"):
                    collector._ingest(body)
                else:
                    collector._ingest_metrics(body)
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.end_headers()

        super().__init__(Handler)

    @property
    def endpoint(self) -> str:
        return self.url

    def _ingest(self, body: bytes) -> None:
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        found = []
        for rs in req.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for span in ss.spans:
                    found.append(
                        CollectedSpan(
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            name=span.name,
                            service=str(resource.get("service.name", "")),
                            attributes={a.key: _value(a.value) for a in span.attributes},
                            resource=resource,
                            kind=int(span.kind),
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                        )
                    )
        with self._lock:
            self.spans.extend(found)

    def _ingest_metrics(self, body: bytes) -> None:
        req = ExportMetricsServiceRequest()
        req.ParseFromString(body)
        for rm in req.resource_metrics:
            service = next((_value(a.value) for a in rm.resource.attributes if a.key == "service.name"), "")
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    kind = metric.WhichOneof("data")
                    points = getattr(metric, kind).data_points if kind else []
                    with self._lock:
                        self.metrics.setdefault((str(service), metric.name), []).extend(
                            {
                                **{a.key: _value(a.value) for a in p.attributes},
                                "_value": getattr(p, "as_int", 0) or getattr(p, "as_double", 0),
                                **({"_count": p.count, "_sum": p.sum} if kind == "histogram" else {}),
                                "_resource": {a.key: _value(a.value) for a in rm.resource.attributes},
                            }
                            for p in points
                        )

    def trace(self, trace_id: str) -> list[CollectedSpan]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]
