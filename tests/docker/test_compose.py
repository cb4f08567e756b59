"""docker/ read without a daemon: the compose file through Debian's docker-compose (v1) `config`,
with and without the cluster profile, the Prometheus config and alert rules through promtool (the
rules checked, and run against their unit tests in alerts_test.yml), the rest parsed as YAML or
JSON."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

DOCKER = Path(__file__).resolve().parents[2] / "docker"


def need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{tool} is required under CI=true (Debian package; make installs it)")
        pytest.skip(f"{tool} is not installed (Debian package; `make` installs it)")
    return path


def load_yaml(path: Path) -> Any:
    return parse_yaml(path.read_text())


def parse_yaml(text: str) -> Any:
    """YAML through the system Python's PyYAML, which Debian's docker-compose depends on (the
    project itself has no YAML dependency)."""
    need("docker-compose")
    script = "import json, sys, yaml; print(json.dumps(yaml.safe_load(sys.stdin)))"
    r = subprocess.run(
        ["/usr/bin/python3", "-c", script], input=text, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def compose(*args: str) -> subprocess.CompletedProcess[str]:
    """`docker-compose -f docker/compose.yaml ARGS...` (v1 takes --profile before the command)."""
    cli = need("docker-compose")
    return subprocess.run(
        [cli, "-f", str(DOCKER / "compose.yaml"), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


DEFAULT_SERVICES = {
    "postgres",
    "broker",
    "orders",
    "billing",
    "relay",
    "reconcile",
    "otel-collector",
    "jaeger",
    "prometheus",
    "grafana",
}
CLUSTER_BROKERS = {
    *("broker-g1-a", "broker-g1-b", "broker-g1-c"),
    *("broker-g2-a", "broker-g2-b", "broker-g2-c"),
}
CLUSTER_SERVICES = {"etcd", "nameserver", "cluster-topics", *CLUSTER_BROKERS}
COORDINATOR = "etcd://etcd:2379"


def test_compose_config_validates() -> None:
    r = compose("config", "-q")
    assert r.returncode == 0, r.stderr


def flag(command: list[str], name: str) -> str | None:
    """The value after ``name`` in a command list (given at most once), or None."""
    assert command.count(name) <= 1, (name, command)
    return command[command.index(name) + 1] if name in command else None


def cluster_config() -> dict[str, Any]:
    r = compose("--profile", "cluster", "config")
    assert r.returncode == 0, r.stderr
    config = parse_yaml(r.stdout)
    assert isinstance(config, dict)
    return config


def test_cluster_profile_validates() -> None:
    r = compose("--profile", "cluster", "config", "-q")
    assert r.returncode == 0, r.stderr
    r = compose("config", "--profiles")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["cluster"]


def test_cluster_profile_starts_only_with_the_profile() -> None:
    """docker-compose v1's `config` lists every service whatever the profile, so this reads the
    profiles themselves: the cluster's services carry `profiles: [cluster]`, the default stack
    none, and no default service depends on a cluster one (that would start it without the
    profile)."""
    services = cluster_config()["services"]
    assert set(services) == DEFAULT_SERVICES | CLUSTER_SERVICES
    for name in CLUSTER_SERVICES:
        assert services[name].get("profiles") == ["cluster"], name
    for name in DEFAULT_SERVICES:
        s = services[name]
        assert "profiles" not in s, name
        assert not set(s.get("depends_on") or ()) & CLUSTER_SERVICES, name


def test_cluster_brokers_elect_through_etcd() -> None:
    config = cluster_config()
    services = config["services"]
    etcd = services["etcd"]["command"]
    assert services["etcd"]["image"].startswith(
        ("quay.io/coreos/etcd:v3.4.", "gcr.io/etcd-development/etcd:v3.4.")
    )
    assert flag(etcd, "--listen-client-urls") == "http://0.0.0.0:2379"
    assert flag(etcd, "--advertise-client-urls") == "http://etcd:2379"

    groups: dict[str, list[str]] = {}
    ids: set[str | None] = set()
    volumes: set[str] = set()
    for name in CLUSTER_BROKERS:
        s = services[name]
        cmd = s["command"]
        assert cmd[:2] == ["txbroker", "serve"], name
        assert flag(cmd, "--coordinator") == COORDINATOR, name
        assert flag(cmd, "--role") == "auto", name
        assert flag(cmd, "--replica-of") is None, name  # --role auto follows the elected master
        assert flag(cmd, "--replication") == "sync", name
        assert flag(cmd, "--host") == "0.0.0.0", name
        # Listening on 0.0.0.0 the broker registers its hostname: the service's name resolves.
        assert s["hostname"] == name
        group = flag(cmd, "--group")
        assert group is not None, name
        groups.setdefault(group, []).append(name)
        ids.add(flag(cmd, "--broker-id"))
        data_dir = flag(cmd, "--data-dir")
        (volume,) = [v for v in s["volumes"] if v.split(":")[1] == data_dir]
        source = volume.split(":")[0]
        assert source in config["volumes"], name  # a named volume, not the container's layer
        volumes.add(source)
        assert "etcd" in s["depends_on"], name
    # three a group: after a failover the new master still has a slave for sync writes
    assert {g: len(b) for g, b in groups.items()} == {"g1": 3, "g2": 3}
    assert len(ids) == len(volumes) == len(CLUSTER_BROKERS)
    assert not volumes & {"brokerdata", "etcddata"}

    ns = services["nameserver"]
    assert ns["command"][:2] == ["txbroker", "nameserver"]
    assert flag(ns["command"], "--coordinator") == COORDINATOR
    assert flag(ns["command"], "--host") == "0.0.0.0"
    assert "etcd" in ns["depends_on"]

    topics = services["cluster-topics"]
    cmd = topics["command"]
    assert cmd[:4] == ["txbroker", "topic", "create", "orders"]
    assert flag(cmd, "--queues") == "8" and flag(cmd, "--groups") == "g1,g2"
    assert flag(cmd, "--coordinator") == COORDINATOR
    # One-shot: retried until both groups have a master, never restarted once done.
    assert topics["restart"] == "on-failure"
    assert set(topics["depends_on"]) >= CLUSTER_BROKERS


def test_every_process_exports_to_the_collector() -> None:
    services = load_yaml(DOCKER / "compose.yaml")["services"]
    ours = {n: s for n, s in services.items() if s.get("image") == "txbroker:local"}
    default = {n for n, s in ours.items() if "profiles" not in s}
    assert default == {"broker", "orders", "billing", "relay", "reconcile"}
    assert set(ours) - default == CLUSTER_SERVICES - {"etcd"}
    for name, s in ours.items():
        env = s["environment"]
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector:4318", name
        assert env["OTEL_SERVICE_NAME"], name


def test_the_services_are_healthy_when_ready_and_read_the_clis_variables() -> None:
    """The example services' healthchecks ask their own /txb/ready (503 while a loop is
    blocked); their broker is TXB_SERVER, the name TxbService reads, like the CLI."""
    services = load_yaml(DOCKER / "compose.yaml")["services"]
    for name in ("orders", "billing"):
        s = services[name]
        port = flag(s["command"], "--port")
        assert s["healthcheck"]["test"] == [
            "CMD",
            "curl",
            "-fsS",
            f"http://127.0.0.1:{port}/txb/ready",
        ], name
        assert s["environment"]["TXB_SERVER"] == "txb://broker:9876", name
        assert "TXB_URL" not in s["environment"], name
    assert services["relay"]["depends_on"]["orders"] == {"condition": "service_healthy"}


def test_prometheus_config_and_rules() -> None:
    promtool = need("promtool")
    for args in (
        ["check", "config", str(DOCKER / "prometheus" / "prometheus.yml")],
        ["check", "rules", str(DOCKER / "prometheus" / "alerts.yml")],
        ["test", "rules", str(DOCKER / "prometheus" / "alerts_test.yml")],  # the rules' unit tests
    ):
        r = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize(
    "path",
    [
        "otel-collector.yaml",
        "prometheus/prometheus.yml",
        "prometheus/alerts.yml",
        "prometheus/alerts_test.yml",
        "grafana/provisioning/datasources/prometheus.yaml",
        "grafana/provisioning/dashboards/txbroker.yaml",
    ],
)
def test_yaml_is_well_formed(path: str) -> None:
    assert isinstance(load_yaml(DOCKER / path), dict)


def test_collector_sends_traces_to_jaeger() -> None:
    config = load_yaml(DOCKER / "otel-collector.yaml")
    traces = config["service"]["pipelines"]["traces"]
    assert traces["receivers"] == ["otlp"] and traces["exporters"] == ["otlp/jaeger"]
    assert config["exporters"]["otlp/jaeger"]["endpoint"] == "jaeger:4317"


def test_dashboard_is_well_formed() -> None:
    dashboard = json.loads((DOCKER / "grafana" / "dashboards" / "txbroker.json").read_text())
    assert dashboard["uid"] == "txbroker" and dashboard["panels"]
    assert all(p["targets"] for p in dashboard["panels"])


def test_image_builds_when_a_daemon_is_present() -> None:
    """Building needs a Docker daemon; without one (as in CI's sandbox) this says so and skips."""
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker CLI: build by hand with `docker build -f docker/Dockerfile .`")
    if subprocess.run([docker, "info"], capture_output=True, timeout=30).returncode != 0:
        pytest.skip("no Docker daemon: build by hand with `docker build -f docker/Dockerfile .`")
    r = subprocess.run(
        [
            docker,
            "build",
            "-f",
            str(DOCKER / "Dockerfile"),
            "-t",
            "txbroker:test",
            str(DOCKER.parent),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
