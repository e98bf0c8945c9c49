"""Deploy files, checked without a Docker engine or a cluster, and the health endpoint they rely on.

docker-compose.yml is validated against the compose-spec JSON Schema (vendored by check-jsonschema),
deploy/k8s against the Kubernetes schemas (vendored by kubernetes-validate, strict: unknown fields
fail); then what the schemas cannot say: Jaeger v2, a health check or probe per service that asks
that service's own endpoint, non-root containers. The endpoint itself is driven end to end: a real
service process is live but not ready before NATS answers, ready once consuming, not ready again
when its server dies, and ``python -m shared.health`` (the compose check) exits accordingly.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from loopwarden.stack import free_port, nats_server_binary, wait_for_port
from shared.health import check
from shared.version import package_version
from tests.conftest import ROOT
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
    for missing in sorted(full):
        with pytest.raises(LookupError, match=f"required variable {missing} is missing"):
            interpolate(compose(), {k: v for k, v in full.items() if k != missing})
    services = interpolate(compose(), full)["services"]
    assert services["planner"]["environment"]["LW_NATS_PASSWORD"] == "pw-planner"
    assert services["nats-1"]["environment"]["LW_NATS_ROUTE_2"] == "nats://route:pw-route@nats-2:6222"
    # NATS (and Jaeger, whose UI has no login) on this host only, unless LW_PUBLISH_HOST says otherwise
    published = {name: s.get("ports", []) for name, s in services.items()}
    assert published["nats-1"] == ["127.0.0.1:4222:4222"]
    assert all(p.startswith("127.0.0.1:") for p in published["jaeger"]), published["jaeger"]
    anywhere = interpolate(compose(), {**full, "LW_PUBLISH_HOST": "0.0.0.0"})["services"]
    assert anywhere["nats-1"]["ports"] == ["0.0.0.0:4222:4222"]
    assert not any(ports for name, ports in published.items() if name not in ("nats-1", "jaeger", "console"))


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


# --- the health endpoint, end to end ---------------------------------------------------------------------


@pytest.fixture
def private_nats(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    server = subprocess.Popen(
        [nats_server_binary(), "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(tmp_path / "js")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port)
        yield f"nats://127.0.0.1:{port}", server
    finally:
        server.kill()
        server.wait(timeout=bound(10))


def start_service(name: str, nats_url: str, health_port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "LW_NATS_URL": nats_url,
        "LW_HEALTH_PORT": str(health_port),
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", f"services.{name}"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )


def wait_until(predicate: Any, timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"{what} after {timeout:.0f}s; service log:\n{log.read_text()[-3000:]}")


def health_command(port: int, *extra: str) -> subprocess.CompletedProcess[str]:
    """What the compose health check runs."""
    return subprocess.run(
        [sys.executable, "-m", "shared.health", "--port", str(port), *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=bound(60),
    )


def test_a_service_is_live_at_once_ready_once_consuming_and_not_ready_without_nats(
    tmp_path: Path, private_nats: tuple[str, subprocess.Popen[bytes]]
) -> None:
    nats_url, server = private_nats
    # 1. pointed at a server that is not there: it answers /livez, and /readyz says it is starting
    dead = f"nats://127.0.0.1:{free_port()}"
    port, log = free_port(), tmp_path / "governor-dead.log"
    proc = start_service("governor", dead, port, log)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: check(f"{base}/livez")[0], bound(60), "no /livez", log)
        ok, said = check(f"{base}/readyz")
        assert not ok and json.loads(said) == {
            "service": "governor",
            "version": package_version(),
            "ready": False,
            "detail": "starting: connecting to NATS and creating consumers",
        }
        assert health_command(port).returncode == 1
        assert health_command(port, "--live").returncode == 0
    finally:
        proc.terminate()
        proc.wait(timeout=bound(30))

    # 2. against a real server: ready once it consumes; the compose check passes
    port, log = free_port(), tmp_path / "governor.log"
    proc = start_service("governor", nats_url, port, log)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: check(f"{base}/readyz")[0], bound(90), "never ready", log)
        assert "loopwarden-governor ready" in log.read_text()
        done = health_command(port)
        assert done.returncode == 0 and json.loads(done.stdout)["ready"] is True, done.stdout + done.stderr
        assert check(f"{base}/nope") == (False, '{"error": "no such endpoint /nope; try /livez or /readyz"}')

        # 3. the server dies: still live (it reconnects), not ready, and the check fails
        server.kill()
        server.wait(timeout=bound(10))
        wait_until(lambda: not check(f"{base}/readyz")[0], bound(30), "still ready with NATS gone", log)
        assert json.loads(check(f"{base}/readyz")[1])["detail"] == "NATS connection lost; reconnecting"
        assert check(f"{base}/livez")[0]
        assert health_command(port).returncode == 1
    finally:
        proc.terminate()
        proc.wait(timeout=bound(30))


def test_a_taken_health_port_stops_the_service_naming_the_setting(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "LW_NATS_URL": f"nats://127.0.0.1:{free_port()}", "LW_HEALTH_PORT": str(port)}
        done = subprocess.run(
            [sys.executable, "-m", "services.judge"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=bound(60),
        )
    assert done.returncode != 0
    assert "invalid setting LW_HEALTH_PORT" in done.stderr and "Traceback" not in done.stderr, done.stderr
