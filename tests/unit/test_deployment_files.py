"""The deployment files (Dockerfile, docker-compose.yml, examples/compose/, the Grafana dashboard)
agree with each other and with the proxy's configuration and metrics.

No Docker engine runs on the development machines, so these read the files; what the files run is
exercised with the processes themselves (`kvproxy check` on the compose config, the image's
HEALTHCHECK command against a local HTTP endpoint).
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shlex
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
KVPROXY_CONFIG = ROOT / "examples" / "compose" / "kvproxy.yaml"
PROMETHEUS = ROOT / "examples" / "compose" / "prometheus.yml"
ALERTS = ROOT / "examples" / "compose" / "kvproxy-alerts.yml"
DASHBOARD = ROOT / "examples" / "grafana-dashboard.json"

# The metrics kvproxy/proxy/ops/metrics.py exports, with their labels.
METRICS: dict[str, set[str]] = {
    "kvproxy_requests_total": {"api", "outcome"},
    "kvproxy_produce_batches_total": {"topic", "outcome"},
    "kvproxy_produce_records_total": {"topic", "outcome"},
    "kvproxy_policy_rejections_total": {"topic", "policy", "code"},
    "kvproxy_bytes_total": {"direction"},
    "kvproxy_client_connections": set(),
    "kvproxy_upstream_connections": set(),
    "kvproxy_upstream_connect_failures_total": {"upstream"},
    "kvproxy_config_reloads_total": {"result"},
    "kvproxy_policy_crashes_total": {"policy"},
    "kvproxy_connections_closed_total": {"reason"},
    "kvproxy_ready": set(),
}
HISTOGRAMS = ("kvproxy_produce_proxy_latency_seconds", "kvproxy_produce_upstream_latency_seconds")
for _histogram in HISTOGRAMS:
    METRICS[f"{_histogram}_bucket"] = {"le"}
    METRICS[f"{_histogram}_sum"] = set()
    METRICS[f"{_histogram}_count"] = set()
# Prometheus' own series, usable next to kvproxy's.
PROMETHEUS_SERIES = {"up": set[str]()}
TARGET_LABELS = {"instance", "job"}


# ---------------------------------------------------------------- helpers


def _compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


def _service(name: str) -> dict[str, Any]:
    service = _compose()["services"][name]
    assert isinstance(service, dict)
    return service


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def _bind_mounts(service: dict[str, Any]) -> list[tuple[Path, PurePosixPath]]:
    """(path in the repo, path in the container) of every bind mount (not named volumes)."""
    mounts = []
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            mounts.append(((ROOT / source).resolve(), PurePosixPath(target)))
    return mounts


def _in_repo(service: dict[str, Any], container_path: str) -> Path:
    """The repository file a container path of `service` is mounted from."""
    wanted = PurePosixPath(container_path)
    for source, target in _bind_mounts(service):
        if wanted == target:
            return source
        if target in wanted.parents:
            return source / wanted.relative_to(target)
    raise AssertionError(f"{container_path} is not inside any bind mount of the service")


def _published(service: dict[str, Any]) -> dict[int, int]:
    """container port -> host port, ranges expanded."""
    published: dict[int, int] = {}
    for entry in service.get("ports", []):
        parts = str(entry).split(":")
        host, container = parts[-2], parts[-1].split("/")[0]
        host_ports = _port_range(host)
        container_ports = _port_range(container)
        assert len(host_ports) == len(container_ports), entry
        published.update(zip(container_ports, host_ports, strict=True))
    return published


def _port_range(text: str) -> list[int]:
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1))


def _kvproxy_yaml() -> dict[str, Any]:
    data = yaml.safe_load(KVPROXY_CONFIG.read_text())
    assert isinstance(data, dict)
    return data


def _listen() -> dict[str, Any]:
    listen = _kvproxy_yaml()["listen"]
    assert isinstance(listen, dict)
    return listen


def _metrics_port() -> int:
    return int(_kvproxy_yaml()["metrics"]["port"])


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n(\s*#[^\n]*\n)*", " ", DOCKERFILE.read_text())
    instructions = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
    return instructions


def _final_stage() -> list[tuple[str, str]]:
    instructions = _dockerfile_instructions()
    last_from = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    return instructions[last_from:]


def _exec_form(args: str) -> list[str]:
    value = json.loads(args)
    assert isinstance(value, list), f"not exec (JSON) form: {args}"
    return [str(v) for v in value]


def _dockerfile_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for keyword, args in _final_stage():
        if keyword == "ENV":
            for item in shlex.split(args):
                key, _, value = item.partition("=")
                env[key] = value
    return env


def _healthcheck_command() -> list[str]:
    (args,) = [a for k, a in _final_stage() if k == "HEALTHCHECK"]
    command = args[args.index("CMD ") + len("CMD ") :]
    return _exec_form(command)


# ---------------------------------------------------------------- compose


def test_compose_has_the_three_services() -> None:
    services = _compose()["services"]
    assert {"kafka", "kvproxy", "prometheus"} <= set(services)
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert services["prometheus"]["image"].startswith("prom/prometheus:")
    for name in ("kafka", "prometheus"):
        tag = services[name]["image"].rpartition(":")[2]
        assert tag and tag != "latest", f"{name} image is not pinned"
    assert services["kvproxy"]["build"] in (".", {"context": "."})


def test_compose_runs_the_kafka_version_the_suite_tests() -> None:
    """The compose file's broker is the Kafka 4.x the integration tests start."""
    from tests.harness.kafka_broker import KAFKA_4

    assert _service("kafka")["image"] == f"apache/kafka:{KAFKA_4}"


def test_every_mounted_file_exists_in_the_repo() -> None:
    for name, service in _compose()["services"].items():
        for source, target in _bind_mounts(service):
            assert source.exists(), f"{name}: {source} (mounted at {target}) does not exist"
            assert ROOT in (source, *source.parents), f"{name}: {source} is outside the repo"


def test_kvproxy_runs_the_compose_config() -> None:
    kvproxy = _service("kvproxy")
    command = kvproxy["command"]
    assert command[0] == "-c"
    assert _in_repo(kvproxy, command[1]) == KVPROXY_CONFIG.resolve()
    # The config's relative schema paths resolve inside the mounted folder too.
    for entry in _kvproxy_yaml()["topics"]:
        for policy in entry.get("policies", []):
            if isinstance(policy, dict) and "json_schema" in policy:
                schema = (KVPROXY_CONFIG.parent / policy["json_schema"]["value"]).resolve()
                assert schema.exists()
                mount_sources = [source for source, _ in _bind_mounts(kvproxy)]
                assert any(source in schema.parents for source in mount_sources)


def test_published_ports_match_the_kvproxy_config() -> None:
    listen = _listen()
    published = _published(_service("kvproxy"))
    lowest = int(listen["lowest_node_id"])
    broker_ports = range(
        int(listen["broker_port_base"]),
        int(listen["broker_port_base"]) + int(listen["max_brokers"]),
    )
    wanted = [int(listen["port"]), *broker_ports, _metrics_port()]
    # The proxy advertises its own port numbers: the host must publish them unchanged.
    assert published == {port: port for port in wanted}
    # The compose broker's node id falls inside the range and gets its port.
    node_id = int(_env(_service("kafka"))["KAFKA_NODE_ID"])
    assert int(listen["broker_port_base"]) + node_id - lowest in broker_ports
    assert listen["host"] == "0.0.0.0"
    assert _kvproxy_yaml()["metrics"]["host"] == "0.0.0.0"
    # Clients on the host reach what is advertised: the loopback the ports are published on.
    hosts = {str(entry).split(":")[0] for entry in _service("kvproxy")["ports"]}
    assert hosts == {listen["advertised_host"]} == {"127.0.0.1"}


def test_kvproxy_bootstraps_from_the_kafka_service() -> None:
    env = _env(_service("kafka"))
    advertised = env["KAFKA_ADVERTISED_LISTENERS"].split(",")
    (plaintext,) = [a for a in advertised if a.startswith("PLAINTEXT://")]
    assert _kvproxy_yaml()["upstream"]["bootstrap_servers"] == [plaintext.split("://")[1]]
    assert _service("kvproxy")["depends_on"]["kafka"]["condition"] == "service_healthy"


def test_kraft_environment_is_consistent() -> None:
    kafka = _service("kafka")
    env = _env(kafka)
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    node_id = env["KAFKA_NODE_ID"]
    voters = dict(v.split("@", 1) for v in env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(","))
    assert node_id in voters
    protocol_map = dict(
        p.split(":") for p in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(",")
    )
    listeners = {}  # name -> port
    for listener in env["KAFKA_LISTENERS"].split(","):
        name, _, address = listener.partition("://")
        listeners[name] = address.rpartition(":")[2]
    controller = env["KAFKA_CONTROLLER_LISTENER_NAMES"]
    assert controller in protocol_map
    assert controller in listeners
    assert set(listeners) <= set(protocol_map)
    # The voter address is this node's controller listener, by its compose host name.
    voter_host, _, voter_port = voters[node_id].rpartition(":")
    assert voter_host == kafka["hostname"] == "kafka"
    assert voter_port == listeners[controller]
    # Advertised listeners: not the controller, named in the map, host = the service name.
    for advertised in env["KAFKA_ADVERTISED_LISTENERS"].split(","):
        name, _, address = advertised.partition("://")
        host, _, port = address.rpartition(":")
        assert name != controller
        assert name in protocol_map
        assert host == "kafka"
        assert port == listeners[name]
    assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] in protocol_map
    # One node: internal topics cannot be replicated three times.
    assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "1"
    assert env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == "1"
    # The healthcheck asks the advertised listener.
    assert "kafka:9092" in " ".join(kafka["healthcheck"]["test"])


def test_compose_kvproxy_healthcheck_uses_the_metrics_port() -> None:
    test = " ".join(_service("kvproxy")["healthcheck"]["test"])
    assert f"http://127.0.0.1:{_metrics_port()}/readyz" in test


def test_compose_gives_kvproxy_open_files_for_its_connection_limit() -> None:
    """Two descriptors per client connection, up to limits.max_connections_per_listener on the
    bootstrap listener alone, and some for the proxy's own (listeners, metrics, lookups)."""
    nofile = _service("kvproxy")["ulimits"]["nofile"]
    limits = yaml.safe_load(KVPROXY_CONFIG.read_text()).get("limits", {})
    per_listener = limits.get("max_connections_per_listener", 10_000)
    assert nofile["soft"] == nofile["hard"] >= 2 * per_listener + 1000


# ---------------------------------------------------------------- prometheus


def test_prometheus_scrapes_the_kvproxy_metrics_port() -> None:
    prometheus = _service("prometheus")
    config_path = next(
        arg.split("=", 1)[1] for arg in prometheus["command"] if arg.startswith("--config.file=")
    )
    assert _in_repo(prometheus, config_path) == PROMETHEUS.resolve()
    config = yaml.safe_load(PROMETHEUS.read_text())
    (job,) = config["scrape_configs"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    targets = [t for static in job["static_configs"] for t in static["targets"]]
    assert targets == [f"kvproxy:{_metrics_port()}"]
    for rule_file in config["rule_files"]:
        assert _in_repo(prometheus, rule_file).resolve() == ALERTS.resolve()


def test_alert_rules_parse_and_use_known_metrics() -> None:
    rules = yaml.safe_load(ALERTS.read_text())
    names = set()
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}
            names.add(rule["alert"])
            _check_promql(rule["expr"], f"alert {rule['alert']}")
    assert {
        "KvproxyNotReady",
        "KvproxyUpstreamConnectFailures",
        "KvproxyRejectionSpike",
        "KvproxyConfigReloadFailed",
        "KvproxyPolicyCrashes",
    } <= names


# ---------------------------------------------------------------- grafana


def _dashboard_expressions() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    found = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            found.append((panel["title"], target["expr"]))
    for variable in dashboard["templating"]["list"]:
        query = variable["query"]["query"]
        found.append((f"variable {variable['name']}", query))
    return found


def test_dashboard_queries_name_only_kvproxy_metrics() -> None:
    expressions = _dashboard_expressions()
    assert len(expressions) >= 10
    used = set()
    for title, expr in expressions:
        used |= _check_promql(expr, title)
    # Every metric the proxy exports is on the dashboard.
    exported = {m for m in METRICS if not m.endswith(("_sum", "_count"))}
    assert exported <= used


_FUNCTIONS_AND_KEYWORDS = {
    "sum", "min", "max", "avg", "count", "rate", "irate", "increase", "histogram_quantile",
    "by", "without", "and", "or", "unless", "offset", "on", "ignoring",
    "group_left", "group_right", "bool", "topk", "bottomk", "abs", "clamp_min", "vector",
}  # fmt: skip


def _check_promql(expr: str, where: str) -> set[str]:
    """The metric names `expr` selects; fail on an unknown metric or a label it does not have."""
    variable_query = re.fullmatch(r"label_values\(\s*(\w+)\s*,\s*(\w+)\s*\)", expr.strip())
    if variable_query:  # a Grafana variable: label_values(metric, label)
        metric, label = variable_query.groups()
        assert metric in METRICS, f"{where}: unknown metric {metric}"
        assert label in METRICS[metric] | TARGET_LABELS, f"{where}: {metric} has no {label}"
        return {metric}
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range selectors, [$__rate_interval]
    expr = re.sub(r"\$\w+", "", expr)  # dashboard variables
    expr = re.sub(r"\b\d+(?:\.\d+)?[a-z]*\b", " ", expr)  # numbers, durations (offset 5m)
    metrics: set[str] = set()
    labels: set[str] = set()
    # label matchers {a="x", b=~"y"} and groupings by (a, b)
    for body in re.findall(r"\{([^}]*)\}", expr):
        labels |= set(re.findall(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)", body))
    for body in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", expr):
        labels |= {label.strip() for label in body.split(",") if label.strip()}
    expr = re.sub(r"\{[^}]*\}", " ", expr)
    expr = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", " ", expr)
    for match in re.finditer(r"[a-zA-Z_:][\w:]*", expr):
        name = match.group()
        if name in _FUNCTIONS_AND_KEYWORDS:
            continue
        assert name in METRICS or name in PROMETHEUS_SERIES, f"{where}: unknown metric {name}"
        metrics.add(name)
    known = set().union(*(METRICS.get(m, PROMETHEUS_SERIES.get(m, set())) for m in metrics))
    unknown = labels - known - TARGET_LABELS
    assert not unknown, f"{where}: labels {sorted(unknown)} are not on {sorted(metrics)}"
    return metrics


# ---------------------------------------------------------------- Dockerfile


def test_dockerfile_base_images_are_pinned_slim_python() -> None:
    froms = [args.split()[0] for keyword, args in _dockerfile_instructions() if keyword == "FROM"]
    assert froms
    assert all(image == "python:3.11-slim" for image in froms), froms


def test_dockerfile_runs_kvproxy_serve_as_non_root() -> None:
    final = _final_stage()
    keywords = [keyword for keyword, _ in final]
    user_at = keywords.index("USER")
    entrypoint_at = keywords.index("ENTRYPOINT")
    assert user_at < entrypoint_at
    user = final[user_at][1].split(":")[0]
    assert user not in ("root", "0")
    assert "USER" not in keywords[user_at + 1 :], "a later USER would override it"
    assert _exec_form(final[entrypoint_at][1]) == ["kvproxy", "serve"]
    (cmd,) = [args for keyword, args in final if keyword == "CMD"]
    assert _exec_form(cmd) == ["-c", "/etc/kvproxy/kvproxy.yaml"]


def test_dockerfile_installs_runtime_dependencies_only() -> None:
    runs = [args for keyword, args in _dockerfile_instructions() if keyword == "RUN"]
    installs = [run for run in runs if "pip install" in run]
    assert installs
    for run in installs:
        assert re.search(r"pip install \.(\s|$)", run), run
        assert "[dev]" not in run and "dev]" not in run
        assert "-e " not in run


def test_dockerfile_copies_every_package_pip_installs() -> None:
    """`pip install .` in the image fails on a package named in pyproject but not copied."""
    import tomllib

    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"
    ]["find"]["include"]
    packages = {name.split(".")[0] for name in include}
    copies = [args.split() for keyword, args in _dockerfile_instructions() if keyword == "COPY"]
    copied = {PurePosixPath(parts[0]).name for parts in copies if not parts[0].startswith("--")}
    assert set(packages) <= copied, set(packages) - copied


def test_dockerfile_exposes_the_compose_ports() -> None:
    exposed: set[int] = set()
    for keyword, args in _final_stage():
        if keyword == "EXPOSE":
            for port in args.split():
                exposed |= set(_port_range(port.split("/")[0]))
    assert set(_published(_service("kvproxy"))) <= exposed


def test_dockerfile_healthcheck_asks_healthz_on_the_metrics_port() -> None:
    command = _healthcheck_command()
    assert command[0] == "python"
    assert "urllib.request" in command[-1]
    url = _dockerfile_env()["KVPROXY_HEALTH_URL"]
    assert url == f"http://127.0.0.1:{_metrics_port()}/healthz"


class _Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/healthz" else 404)
        self.end_headers()
        self.wfile.write(b"ok\n")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[http.server.HTTPServer]:
    server = http.server.HTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(("status", "healthy"), [(200, True), (503, False)])
def test_dockerfile_healthcheck_command_exit_status(
    health_server: http.server.HTTPServer, status: int, healthy: bool, monkeypatch: Any
) -> None:
    """The HEALTHCHECK command, run as docker runs it, exits 0 on 200 and non-zero otherwise."""
    monkeypatch.setattr(_Health, "status", status)
    port = health_server.server_address[1]
    command = [sys.executable, *_healthcheck_command()[1:]]
    env = {**os.environ, "KVPROXY_HEALTH_URL": f"http://127.0.0.1:{port}/healthz"}
    result = subprocess.run(command, env=env, capture_output=True, timeout=30, check=False)
    assert (result.returncode == 0) is healthy


def test_dockerfile_healthcheck_fails_when_nothing_listens() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connections are refused
        command = [sys.executable, *_healthcheck_command()[1:]]
        env = {**os.environ, "KVPROXY_HEALTH_URL": f"http://127.0.0.1:{port}/healthz"}
        result = subprocess.run(command, env=env, capture_output=True, timeout=30, check=False)
    assert result.returncode != 0


def test_dockerignore_keeps_local_state_out() -> None:
    ignored = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv", ".pytest_cache", ".mypy_cache", ".hypothesis", "*.egg-info"} <= ignored


# ---------------------------------------------------------------- the compose config itself


def test_compose_kvproxy_config_passes_kvproxy_check(tmp_path: Path) -> None:
    """`kvproxy check` accepts the compose config. Should the `metrics` section not be known (a
    proxy without metrics), it is stripped and the rest must still be valid."""
    result = _check(KVPROXY_CONFIG)
    if result.returncode != 0 and "metrics: unknown key" in result.stderr:
        problems = [line for line in result.stderr.splitlines() if line.startswith("  ")]
        assert problems == ["  metrics: unknown key"], result.stderr
        data = _kvproxy_yaml()
        del data["metrics"]
        stripped = KVPROXY_CONFIG.parent / f".check-{os.getpid()}-{tmp_path.name}.yaml"
        stripped.write_text(yaml.safe_dump(data))  # beside the original: relative paths hold
        try:
            result = _check(stripped)
        finally:
            stripped.unlink()
    assert result.returncode == 0, result.stderr
    assert "OK" in result.stdout.splitlines()[0]
    assert "advertised as 127.0.0.1" in result.stdout


def _check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvproxy.cli", "check", "-c", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
