"""JSON Schemas of the two custom resources the manifests use, which the Kubernetes schemas
(kubernetes-validate) do not know: KEDA's ``ScaledObject`` (keda.sh/v1alpha1) and the Prometheus
Operator's ``PodMonitor`` (monitoring.coreos.com/v1), written from their documented fields
(keda.sh/docs/<version>/reference/scaledobject-spec, /scalers/nats-jetstream; the Operator's API
reference). Strict like ``kubernetes_validate.validate(..., strict=True)``: a field neither documents is
an error, so a misspelt key fails here as it would be ignored (or refused) by the cluster."""

from __future__ import annotations

from typing import Any

STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
METADATA = {
    "type": "object",
    "required": ["name", "namespace"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
        "namespace": {"type": "string"},
        "labels": STRING_MAP,
        "annotations": STRING_MAP,
    },
}
QUANTITY = {"type": "string", "pattern": "^[0-9]+$"}  # KEDA's metadata values are strings

NATS_JETSTREAM_METADATA = {
    "type": "object",
    "required": ["natsServerMonitoringEndpoint", "account", "stream", "consumer", "lagThreshold"],
    "additionalProperties": False,
    "properties": {
        "natsServerMonitoringEndpoint": {"type": "string", "pattern": r"^[a-z0-9.-]+:[0-9]+$"},
        "account": {"type": "string", "minLength": 1},
        "stream": {"type": "string", "minLength": 1},
        "consumer": {"type": "string", "minLength": 1},
        "lagThreshold": QUANTITY,
        "activationLagThreshold": QUANTITY,
        "useHttps": {"enum": ["true", "false"]},
    },
}

SCALED_OBJECT: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": METADATA,
        "spec": {
            "type": "object",
            "required": ["scaleTargetRef", "triggers"],
            "additionalProperties": False,
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "required": ["name"],
                    "additionalProperties": False,
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "name": {"type": "string"},
                        "envSourceContainerName": {"type": "string"},
                    },
                },
                "pollingInterval": {"type": "integer", "minimum": 1},
                "cooldownPeriod": {"type": "integer", "minimum": 0},
                "initialCooldownPeriod": {"type": "integer", "minimum": 0},
                "idleReplicaCount": {"type": "integer", "minimum": 0},
                "minReplicaCount": {"type": "integer", "minimum": 0},
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "fallback": {
                    "type": "object",
                    "required": ["failureThreshold", "replicas"],
                    "additionalProperties": False,
                    "properties": {
                        "failureThreshold": {"type": "integer", "minimum": 1},
                        "replicas": {"type": "integer", "minimum": 0},
                    },
                },
                "advanced": {"type": "object"},
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["type", "metadata"],
                        "additionalProperties": False,
                        "properties": {
                            "type": {"type": "string"},
                            "name": {"type": "string"},
                            "metadata": {"type": "object"},
                            "authenticationRef": {"type": "object"},
                            "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                            "useCachedMetrics": {"type": "boolean"},
                        },
                        "if": {"properties": {"type": {"const": "nats-jetstream"}}},
                        "then": {"properties": {"metadata": NATS_JETSTREAM_METADATA}},
                    },
                },
            },
        },
    },
}

LABEL_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "matchLabels": STRING_MAP,
        "matchExpressions": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["key", "operator"],
                "additionalProperties": False,
                "properties": {
                    "key": {"type": "string"},
                    "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                    "values": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
    },
}
DURATION = {"type": "string", "pattern": r"^([0-9]+(ms|s|m|h))+$"}

POD_MONITOR: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PodMonitor"},
        "metadata": METADATA,
        "spec": {
            "type": "object",
            "required": ["selector", "podMetricsEndpoints"],
            "additionalProperties": False,
            "properties": {
                "jobLabel": {"type": "string"},
                "podTargetLabels": {"type": "array", "items": {"type": "string"}},
                "selector": LABEL_SELECTOR,
                "namespaceSelector": {"type": "object"},
                "sampleLimit": {"type": "integer", "minimum": 0},
                "podMetricsEndpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "portNumber": {"type": "integer"},
                            "path": {"type": "string", "pattern": "^/"},
                            "scheme": {"enum": ["http", "https"]},
                            "interval": DURATION,
                            "scrapeTimeout": DURATION,
                            "honorLabels": {"type": "boolean"},
                            "relabelings": {"type": "array"},
                            "metricRelabelings": {"type": "array"},
                        },
                    },
                },
            },
        },
    },
}

SCHEMAS = {"ScaledObject": SCALED_OBJECT, "PodMonitor": POD_MONITOR}
