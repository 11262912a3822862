"""docker-compose.yml's schema registry: a Confluent Schema Registry stored in the compose broker,
which kvproxy's compose config asks for its `schema` policy.

No Docker engine runs on the development machines, so these read the files.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
KVPROXY_CONFIG = ROOT / "examples" / "compose" / "kvproxy.yaml"
REGISTRY = "schema-registry"


def _services() -> dict[str, Any]:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    assert isinstance(services, dict)
    return services


def _registry_env() -> dict[str, str]:
    env = _services()[REGISTRY]["environment"]
    assert isinstance(env, dict), "environment as a mapping"
    return {str(k): str(v) for k, v in env.items()}


def _kvproxy_config() -> dict[str, Any]:
    data = yaml.safe_load(KVPROXY_CONFIG.read_text())
    assert isinstance(data, dict)
    return data


def _registry_port() -> int:
    (listener,) = _registry_env()["SCHEMA_REGISTRY_LISTENERS"].split(",")
    port = urlsplit(listener).port
    assert port is not None
    return port


def test_the_registry_is_a_pinned_confluent_schema_registry() -> None:
    image = _services()[REGISTRY]["image"]
    name, _, tag = image.rpartition(":")
    assert name == "confluentinc/cp-schema-registry"
    assert tag and tag != "latest"


def test_the_registry_stores_its_schemas_in_the_compose_broker() -> None:
    services = _services()
    env = _registry_env()
    kafka = services["kafka"]["environment"]
    (plaintext,) = [
        a for a in kafka["KAFKA_ADVERTISED_LISTENERS"].split(",") if a.startswith("PLAINTEXT://")
    ]
    assert env["SCHEMA_REGISTRY_KAFKASTORE_BOOTSTRAP_SERVERS"] == plaintext
    # One broker: a replication factor above 1 could never be met.
    assert int(env["SCHEMA_REGISTRY_KAFKASTORE_TOPIC_REPLICATION_FACTOR"]) == 1
    assert env["SCHEMA_REGISTRY_HOST_NAME"] == REGISTRY
    assert services[REGISTRY]["depends_on"]["kafka"]["condition"] == "service_healthy"


def test_the_registry_is_published_on_loopback_and_checked() -> None:
    registry = _services()[REGISTRY]
    port = _registry_port()
    assert registry["ports"] == [f"127.0.0.1:{port}:{port}"]
    check = " ".join(registry["healthcheck"]["test"])
    assert f"http://localhost:{port}/subjects" in check


def test_kvproxy_asks_the_compose_registry_and_starts_after_it() -> None:
    services = _services()
    url = _kvproxy_config()["schema_registry"]["url"]
    address = urlsplit(url)
    assert (address.scheme, address.hostname, address.port) == ("http", REGISTRY, _registry_port())
    assert services["kvproxy"]["depends_on"][REGISTRY]["condition"] == "service_healthy"


def test_a_compose_topic_uses_the_schema_policy_beside_the_default_checks() -> None:
    config = _kvproxy_config()
    defaults = config["defaults"]["policies"]
    with_schema = [
        topic["match"]
        for topic in config["topics"]
        if any(isinstance(p, dict) and "schema" in p for p in topic.get("policies", []))
    ]
    assert with_schema, "no topic of the compose config uses the schema policy"
    # As `kvproxy check` shows the rules: the schema policy runs with the defaults' checks.
    check = subprocess.run(
        [sys.executable, "-m", "kvproxy.cli", "check", "-c", str(KVPROXY_CONFIG)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    for match in with_schema:
        (line,) = [x for x in check.stdout.splitlines() if x.strip().startswith(f"{match}: ")]
        policies = line.split("policies: ", 1)[1].split(";", 1)[0].split(", ")
        assert set(defaults) | {"schema"} <= set(policies), line
