"""The SNI deployment the docs show is one that works: its kvproxy.yaml loads, and the Kubernetes
objects around it agree with it (ports, names, the certificate's names, the mounted paths)."""

from __future__ import annotations

import datetime
import re
from pathlib import Path
from typing import Any

import yaml

from kvproxy.commands.certificate_coverage import Certificate, certificate_coverage
from kvproxy.proxy.config.proxy_config import ProxyConfig, load_config_and_rules

DOCS = Path(__file__).resolve().parents[2] / "docs"
NOW = datetime.datetime.now(datetime.UTC)


def yaml_blocks(doc: str, heading: str) -> list[Any]:
    """Every YAML document of the ```yaml blocks under `heading` (up to the next heading of the
    same level)."""
    text = (DOCS / doc).read_text()
    level = heading.split(" ", 1)[0]
    section = text.split(f"\n{heading}\n", 1)[1].split(f"\n{level} ", 1)[0]
    blocks = re.findall(r"```yaml\n(.*?)```", section, flags=re.DOTALL)
    return [document for block in blocks for document in yaml.safe_load_all(block)]


def load(tmp_path: Path, document: str | dict[str, Any]) -> ProxyConfig:
    path = tmp_path / "kvproxy.yaml"
    path.write_text(document if isinstance(document, str) else yaml.safe_dump(document))
    config, routing = load_config_and_rules(path)
    routing.close()
    return config


def by_kind(documents: list[Any]) -> dict[str, list[dict[str, Any]]]:
    kinds: dict[str, list[dict[str, Any]]] = {}
    for document in documents:
        kinds.setdefault(document["kind"], []).append(document)
    return kinds


def test_the_configuration_reference_example_loads(tmp_path: Path) -> None:
    (example,) = yaml_blocks(
        "configuration.md", "### SNI routing: every broker behind one TLS port"
    )
    config = load(tmp_path, example)
    assert config.listen.sni is not None
    assert not config.listen.port_per_broker


def test_the_kubernetes_example_agrees_with_its_configuration(tmp_path: Path) -> None:
    kinds = by_kind(yaml_blocks("operations.md", "### Kubernetes"))
    config = load(tmp_path, kinds["ConfigMap"][0]["data"]["kvproxy.yaml"])
    sni, tls = config.listen.sni, config.listen.sni_tls
    assert sni is not None and tls is not None and not config.listen.port_per_broker

    pod = kinds["Deployment"][0]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"sni": sni.port, "metrics": config.metrics.port}
    mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
    assert mounts["config"] == "/etc/kvproxy"  # the image runs `kvproxy serve -c` the file there
    assert "/etc/kvproxy/kvproxy.yaml" in (DOCS.parent / "Dockerfile").read_text()
    assert tls.cert_file.parent == tls.key_file.parent == Path(mounts["tls"])
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert volumes["config"]["configMap"]["name"] == kinds["ConfigMap"][0]["metadata"]["name"]
    (certificate,) = kinds["Certificate"]
    assert volumes["tls"]["secret"]["secretName"] == certificate["spec"]["secretName"]
    assert {tls.cert_file.name, tls.key_file.name} == {"tls.crt", "tls.key"}  # kubernetes.io/tls

    dns_names = tuple(certificate["spec"]["dnsNames"])
    coverage = certificate_coverage(Certificate(dns_names, NOW, NOW), sni.names, None, NOW)
    assert coverage.problems == ()

    load_balancer, internal = kinds["Service"]
    assert load_balancer["spec"]["type"] == "LoadBalancer"
    (entry,) = load_balancer["spec"]["ports"]
    assert (entry["port"], entry["targetPort"]) == (sni.advertised_port, "sni")
    (internal_port,) = internal["spec"]["ports"]
    assert internal_port["targetPort"] == "sni"

    (ingress,) = kinds["Ingress"]
    annotations = ingress["metadata"]["annotations"]
    assert annotations == {"nginx.ingress.kubernetes.io/ssl-passthrough": "true"}
    rules = ingress["spec"]["rules"]
    assert [rule["host"] for rule in rules] == [sni.bootstrap] + [
        sni.names.name_of(node) for node in (1, 2, 3)
    ]
    for rule in rules:
        (path,) = rule["http"]["paths"]
        service = path["backend"]["service"]
        assert service == {"name": internal["metadata"]["name"], "port": {"name": "kafka-tls"}}
    assert internal_port["name"] == "kafka-tls"
