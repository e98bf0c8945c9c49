"""Deploy files, checked without a Docker engine or a cluster, and the health endpoint they rely on.

docker-compose.yml is validated against the compose-spec JSON Schema (vendored by check-jsonschema),
deploy/k8s against the Kubernetes schemas (vendored by kubernetes-validate, strict: unknown fields
fail); then what the schemas cannot say: Jaeger v2, a health check or probe per service that asks
that service's own endpoint, non-root containers. The endpoint itself, driven end to end by a real service
process: ``tests/own/test_service_health.py``.
"""

from __future__ import annotations

import json
import re
import subprocess
from importlib import resources
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.support.paths import ROOT
from tests.support.timing import bound

SERVICES = ("planner", "executor", "validator", "judge", "governor", "escalation")
K8S_VERSION = "1.37.0"
COMPOSE = ROOT / "docker-compose.yml"
MANIFESTS = ROOT / "deploy" / "k8s" / "loopwarden.yaml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


def manifests() -> list[dict[str, Any]]:
    return [m for m in yaml.safe_load_all(MANIFESTS.read_text()) if m]


def pod_specs() -> dict[str, dict[str, Any]]:
    pods = [m for m in manifests() if m["kind"] in ("Deployment", "Job")]
    return {m["metadata"]["name"]: m["spec"]["template"]["spec"] for m in pods}


def config_map() -> dict[str, str]:
    data: dict[str, str] = next(m for m in manifests() if m["kind"] == "ConfigMap")["data"]
    return data


# --- schemas -------------------------------------------------------------------------------------------


def test_compose_file_is_valid_against_the_compose_spec() -> None:
    schema = json.loads(
        resources.files("check_jsonschema.builtin_schemas.vendor").joinpath("compose-spec.json").read_text()
    )
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(compose())]
    assert not errors, "docker-compose.yml breaks the compose spec:\n" + "\n".join(errors)
    # the validator does reject what compose would: a misspelt health check key
    broken = compose()
    broken["services"]["planner"]["healthcheck"]["tset"] = broken["services"]["planner"]["healthcheck"].pop("test")
    assert list(validator.iter_errors(broken))


def test_k8s_manifests_are_valid_kubernetes_objects() -> None:
    problems = []
    for m in manifests():
        try:
            kubernetes_validate.validate(m, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as err:
            problems.append(f"{m['kind']} {m['metadata']['name']}: {err.message}")
    assert not problems, "\n".join(problems)
    probe = manifests()[3]
    probe["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/readyz"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(probe, K8S_VERSION, strict=True)


# --- credentials and exposure (D22) ----------------------------------------------------------------------

_VAR = re.compile(r"\$\{(\w+)(?::([-?])((?:[^{}]|\{[^{}]*\})*))?\}")


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's ``${VAR}``, ``${VAR:-default}`` and ``${VAR:?error}`` over the parsed file; a missing
    required variable raises, as ``docker compose`` refuses to start."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3)
        if env.get(name):
            return env[name]
        if op == "?":
            raise LookupError(f"required variable {name} is missing a value: {arg}")
        return arg if op == "-" else ""

    return _VAR.sub(one, value)


def test_compose_refuses_to_start_without_every_nats_password_and_publishes_on_this_host_only() -> None:
    text = COMPOSE.read_text()
    assert not re.search(r"\$\{LW_NATS_[A-Z_]*PASSWORD[A-Z_]*:-", text), "a NATS password has a default"
    assert "dev-" not in text
    users = sorted({u.upper() for u in re.findall(r"LW_NATS_PASSWORD_([A-Z_]+)", text)})
    assert {"ADMIN", "CLIENT", "ALICE", "BOB", "PLANNER"} <= set(users)
    full = {f"LW_NATS_PASSWORD_{u}": f"pw-{u.lower()}" for u in users}
    full |= {"LW_NATS_ROUTE_PASSWORD": "pw-route", "LW_CONSOLE_SECRET": "s", "LW_CONSOLE_USERS": "{}"}
    full |= {"LW_GRAFANA_PASSWORD": "pw-grafana"}
    for missing in sorted(full):
        with pytest.raises(LookupError, match=f"required variable {missing} is missing"):
            interpolate(compose(), {k: v for k, v in full.items() if k != missing})
    services = interpolate(compose(), full)["services"]
    assert services["planner"]["environment"]["LW_NATS_PASSWORD"] == "pw-planner"
    assert services["nats-1"]["environment"]["LW_NATS_ROUTE_2"] == "nats://route:pw-route@nats-2:6222"
    # NATS (and Jaeger, whose UI has no login) on this host only, unless LW_PUBLISH_HOST says otherwise
    published = {name: s.get("ports", []) for name, s in services.items()}
    assert published["nats-1"] == ["127.0.0.1:4222:4222"]
    for name in ("jaeger", "prometheus", "grafana"):  # no login (Prometheus), or one password (Grafana)
        assert published[name] and all(p.startswith("127.0.0.1:") for p in published[name]), published[name]
    anywhere = interpolate(compose(), {**full, "LW_PUBLISH_HOST": "0.0.0.0"})["services"]
    assert anywhere["nats-1"]["ports"] == ["0.0.0.0:4222:4222"]
    public = ("nats-1", "jaeger", "console", "prometheus", "grafana")
    assert not any(ports for name, ports in published.items() if name not in public)


# --- what the schemas cannot say -----------------------------------------------------------------------


def test_compose_runs_jaeger_v2_and_every_service_exports_to_it() -> None:
    services = compose()["services"]
    jaeger = services["jaeger"]
    assert re.fullmatch(r"jaegertracing/jaeger:2\.\d+\.\d+", jaeger["image"]), jaeger["image"]
    ports = {p.split(":", 1)[1] for p in interpolate(jaeger["ports"], {})}  # "<host>:<port>:<port>" (D22)
    assert {"16686:16686", "4318:4318"} <= ports  # the UI, OTLP/HTTP in
    for name in (*SERVICES, "console"):
        assert services[name]["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://jaeger:4318"
        assert services[name]["depends_on"]["jaeger"] == {"condition": "service_started"}


def test_every_service_has_a_health_check_and_probes_on_its_own_endpoint() -> None:
    services = compose()["services"]
    for name in SERVICES:
        assert services[name]["healthcheck"]["test"] == ["CMD", "python", "-m", "shared.health"], name
    console = services["console"]
    port = console["environment"]["LW_CONSOLE_PORT"]
    assert console["healthcheck"]["test"][-1] == f"http://127.0.0.1:{port}/healthz"
    for node in ("nats-1", "nats-2", "nats-3"):
        assert "healthz" in " ".join(services[node]["healthcheck"]["test"])
        assert services["bootstrap"]["depends_on"][node] == {"condition": "service_healthy"}
    # the image sets the health port the check reads
    env = dict(re.findall(r"(LW_HEALTH_\w+)=(\S+)", DOCKERFILE.read_text()))
    assert env == {"LW_HEALTH_PORT": "8081", "LW_HEALTH_HOST": "0.0.0.0"}

    health_port = int(config_map()["LW_HEALTH_PORT"])
    assert health_port == int(env["LW_HEALTH_PORT"])
    specs = pod_specs()
    for name in SERVICES:
        container = specs[f"loopwarden-{name}"]["containers"][0]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        for probe, path in (("livenessProbe", "/livez"), ("readinessProbe", "/readyz"), ("startupProbe", "/livez")):
            get = container[probe]["httpGet"]
            assert (get["path"], ports[get["port"]]) == (path, health_port), (name, probe)
    console_container = specs["loopwarden-console"]["containers"][0]
    env_k8s = {e["name"]: e.get("value") for e in console_container["env"]}
    ports = {p["name"]: p["containerPort"] for p in console_container["ports"]}
    for probe in ("livenessProbe", "readinessProbe"):
        get = console_container[probe]["httpGet"]
        assert (get["path"], ports[get["port"]]) == ("/healthz", int(env_k8s["LW_CONSOLE_PORT"]))


def test_containers_run_as_a_non_root_user() -> None:
    users = re.findall(r"^USER\s+(\S+)", DOCKERFILE.read_text(), flags=re.M)
    assert users, "the Dockerfile sets no USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) > 0, f"USER {users[-1]}: numeric and not root, so runAsNonRoot can verify it"
    assert gid.isdigit() and int(gid) > 0
    for name, spec in pod_specs().items():
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True, name
        assert pod["runAsUser"] == int(uid), name
        for container in spec["containers"]:
            ctx = container["securityContext"]
            assert ctx["allowPrivilegeEscalation"] is False, name
            assert ctx["capabilities"]["drop"] == ["ALL"], name
    # and the pods tell OpenTelemetry who they are (OTEL_RESOURCE_ATTRIBUTES, honoured by shared/telemetry.py)
    for name in SERVICES:
        env = {e["name"]: e for e in pod_specs()[f"loopwarden-{name}"]["containers"][0]["env"]}
        assert "service.instance.id=$(POD_UID)" in env["OTEL_RESOURCE_ATTRIBUTES"]["value"]
        names = list(env)
        assert names.index("POD_UID") < names.index("OTEL_RESOURCE_ATTRIBUTES")  # $(VAR) needs it defined first


# --- monitoring and scaling (docs/observability.md) ------------------------------------------------------

PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
GRAFANA_DIR = ROOT / "deploy" / "grafana"
SCALING = ROOT / "deploy" / "k8s" / "scaling.yaml"
MONITORING = ROOT / "deploy" / "k8s" / "monitoring.yaml"
SCALABLE = ("planner", "executor", "validator", "judge")


def custom_resources() -> list[dict[str, Any]]:
    return [m for f in (SCALING, MONITORING) for m in yaml.safe_load_all(f.read_text()) if m]


def test_compose_runs_prometheus_on_every_replica_with_the_rules_and_grafana_with_the_dashboard() -> None:
    services = compose()["services"]
    prom = services["prometheus"]
    assert "./deploy/prometheus:/etc/prometheus:ro" in prom["volumes"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in prom["command"]
    checked = subprocess.run(
        ["promtool", "check", "config", str(PROMETHEUS_DIR / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=bound(60),
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr  # the rules file beside it loads too
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j["dns_sd_configs"][0] for j in config["scrape_configs"]}
    health_port = int(re.findall(r"LW_HEALTH_PORT=(\d+)", DOCKERFILE.read_text())[0])
    console_port = int(services["console"]["environment"]["LW_CONSOLE_PORT"])
    assert set(jobs) == {f"loopwarden-{s}" for s in (*SERVICES, "console")}
    for name in (*SERVICES, "console"):  # each replica by compose's DNS, on the port its /metrics is on
        sd = jobs[f"loopwarden-{name}"]
        assert sd["names"] == [name] and name in services and sd["type"] == "A"
        assert sd["port"] == (console_port if name == "console" else health_port)
    grafana = services["grafana"]
    mounts = dict(v.rsplit(":", 1)[0].split(":", 1) for v in grafana["volumes"])
    assert mounts["./deploy/grafana/loopwarden.json"].startswith("/var/lib/grafana/dashboards/")
    provider = yaml.safe_load((GRAFANA_DIR / "provisioning" / "dashboards" / "loopwarden.yml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    source = yaml.safe_load((GRAFANA_DIR / "provisioning" / "datasources" / "prometheus.yml").read_text())
    assert source["datasources"][0]["url"] == "http://prometheus:9090" and source["datasources"][0]["isDefault"]
    assert json.loads((GRAFANA_DIR / "loopwarden.json").read_text())["uid"] == "loopwarden"


def test_every_pod_is_annotated_for_scraping_on_its_metrics_port() -> None:
    pods = {m["metadata"]["name"]: m["spec"]["template"] for m in manifests() if m["kind"] == "Deployment"}
    for name in (*SERVICES, "console"):
        template = pods[f"loopwarden-{name}"]
        notes = template["metadata"]["annotations"]
        ports = {p["name"]: p["containerPort"] for p in template["spec"]["containers"][0]["ports"]}
        assert notes["prometheus.io/scrape"] == "true" and notes["prometheus.io/path"] == "/metrics", name
        assert int(notes["prometheus.io/port"]) == ports["http" if name == "console" else "health"], name


def test_keda_and_prometheus_operator_objects_validate_against_their_documented_fields() -> None:
    """Not in the Kubernetes schemas: validated against tests/support/crd_schemas.py (from KEDA's and the
    Operator's documented fields, strict), then what a schema cannot say."""
    from tests.support.crd_schemas import SCHEMAS

    objects = custom_resources()
    for obj in objects:
        schema = SCHEMAS[obj["kind"]]
        errors = [
            f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in jsonschema.Draft202012Validator(schema).iter_errors(obj)
        ]
        assert not errors, f"{obj['kind']} {obj['metadata']['name']}:\n" + "\n".join(errors)
    # the schemas refuse what the cluster would not take: a misspelt field, a trigger without its consumer
    scaled = next(o for o in objects if o["kind"] == "ScaledObject")
    bad = json.loads(json.dumps(scaled))
    bad["spec"]["minReplicaCont"] = bad["spec"].pop("minReplicaCount")
    assert list(jsonschema.Draft202012Validator(SCHEMAS["ScaledObject"]).iter_errors(bad))
    bad = json.loads(json.dumps(scaled))
    del bad["spec"]["triggers"][0]["metadata"]["consumer"]
    assert list(jsonschema.Draft202012Validator(SCHEMAS["ScaledObject"]).iter_errors(bad))
    monitor = next(o for o in objects if o["kind"] == "PodMonitor")
    bad = json.loads(json.dumps(monitor))
    bad["spec"]["podMetricsEndpoints"][0]["paht"] = "/metrics"
    assert list(jsonschema.Draft202012Validator(SCHEMAS["PodMonitor"]).iter_errors(bad))


def test_each_scalable_service_scales_on_the_backlog_of_durables_it_reads() -> None:
    from shared import subjects as S
    from shared.permissions import GRANTS, grants

    deployments = {m["metadata"]["name"] for m in manifests() if m["kind"] == "Deployment"}
    scaled = {o["spec"]["scaleTargetRef"]["name"]: o for o in custom_resources() if o["kind"] == "ScaledObject"}
    assert set(scaled) == {f"loopwarden-{s}" for s in SCALABLE} and set(scaled) <= deployments
    account = re.search(r"^accounts \{\s*(\w+) \{", (ROOT / "deploy" / "nats" / "auth.conf").read_text(), re.M)
    assert account is not None
    durables = grants(["search", "calculator"])
    for service in SCALABLE:
        obj = scaled[f"loopwarden-{service}"]
        assert obj["metadata"]["namespace"] == "loopwarden" and obj["spec"]["minReplicaCount"] >= 2
        reads = set(durables[service].consumers)
        for trigger in obj["spec"]["triggers"]:
            meta = trigger["metadata"]
            assert trigger["type"] == "nats-jetstream"
            assert (meta["stream"], meta["consumer"]) in reads, (service, meta)
            assert meta["account"] == account.group(1)
    assert (S.STREAM_SUBMIT, S.DURABLE_PLANNER_SUBMIT) in {
        (t["metadata"]["stream"], t["metadata"]["consumer"]) for t in scaled["loopwarden-planner"]["spec"]["triggers"]
    }
    assert GRANTS["judge"].consumers[0] == (S.STREAM_CMD, S.DURABLE_JUDGE)
    # the PodMonitor selects every Loopwarden pod, on ports the pods have
    monitor = next(o for o in custom_resources() if o["kind"] == "PodMonitor")
    selected = set(monitor["spec"]["selector"]["matchExpressions"][0]["values"])
    apps = {m["spec"]["template"]["metadata"]["labels"]["app"] for m in manifests() if m["kind"] == "Deployment"}
    assert selected == apps
    ports = {p["name"] for spec in pod_specs().values() for c in spec["containers"] for p in c.get("ports", [])}
    assert {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]} <= ports
