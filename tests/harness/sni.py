"""kvproxy's SNI listener in front of a cluster, for real clients: every broker behind one TLS port,
the server name a client sends choosing the broker.

    with make_tls_files(hostnames=CERTIFICATE_NAMES) as tls:
        proxy, sni = sni_proxy(tmp_path, cluster.bootstrap_servers, tls)
        proxy.start(); wait_for_sni(sni)
        Producer({**sni.librdkafka(), ...})         # bootstrap.kafka.localhost:PORT, the test CA
        sni.broker_address(2)                       # "broker-2.kafka.localhost:PORT"

The names are under `localhost` (RFC 6761): glibc's myhostname NSS module resolves them to loopback
without an /etc/hosts entry (`make test` installs libnss-myhostname), ::1 first, then 127.0.0.1.
The proxy listens on 127.0.0.1 only, so each client's settings here make it use IPv4. Every client
verifies the proxy's certificate, host name included, against the test CA.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from tests.harness.metrics import ServesMetrics, scrape
from tests.harness.processes import wait_until
from tests.harness.proxy_process import HOST, ProxyProcess
from tests.harness.tansu import free_port
from tests.harness.tls import TlsFiles

__all__ = [
    "BOOTSTRAP_NAME",
    "BROKER_NAMES",
    "CERTIFICATE_NAMES",
    "JAVA_IPV4",
    "SniEndpoint",
    "accepted_connections",
    "running_sni_proxy",
    "sni_proxy",
    "wait_for_sni",
]

DOMAIN: Final = "kafka.localhost"
BOOTSTRAP_NAME: Final = f"bootstrap.{DOMAIN}"
BROKER_NAMES: Final = f"broker-$(nodeId).{DOMAIN}"
CERTIFICATE_NAMES: Final = (f"*.{DOMAIN}",)
"""The SAN that covers the bootstrap and every broker name (one wildcard)."""
JAVA_IPV4: Final = ("-Djava.net.preferIPv4Stack=true",)
"""JVM options of a Java client that must not try the names' ::1 first."""


@dataclass(frozen=True)
class SniEndpoint:
    """The SNI port as a client sees it: one bootstrap name and the CA to trust."""

    port: int
    ca: Path

    @property
    def bootstrap(self) -> str:
        return f"{BOOTSTRAP_NAME}:{self.port}"

    def broker_address(self, node_id: int) -> str:
        """What answers through the SNI port name broker `node_id`."""
        return f"{BROKER_NAMES.replace('$(nodeId)', str(node_id))}:{self.port}"

    def librdkafka(self) -> dict[str, str]:
        """confluent-kafka's settings (kcat's `-X` ones too)."""
        return {
            "bootstrap.servers": self.bootstrap,
            "security.protocol": "SSL",
            "ssl.ca.location": str(self.ca),
            "ssl.endpoint.identification.algorithm": "https",
            "broker.address.family": "v4",
        }

    def kcat(self) -> list[str]:
        """kcat's options for the port."""
        options = ["-b", self.bootstrap]
        for key, value in self.librdkafka().items():
            if key != "bootstrap.servers":
                options += ["-X", f"{key}={value}"]
        return options

    def kafka_python(self) -> dict[str, Any]:
        """kafka-python's keyword arguments (it tries each address a name resolves to)."""
        return {
            "bootstrap_servers": self.bootstrap,
            "security_protocol": "SSL",
            "ssl_cafile": str(self.ca),
            "ssl_check_hostname": True,
        }

    def java(self) -> dict[str, str]:
        """The Java client's properties (with :data:`JAVA_IPV4` on its JVM)."""
        return {
            "security.protocol": "SSL",
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca),
            "ssl.endpoint.identification.algorithm": "https",
        }


def sni_proxy(
    directory: Path, servers: list[str], tls: TlsFiles
) -> tuple[ProxyProcess, SniEndpoint]:
    """`kvproxy serve` (not started) in front of `servers` with an SNI listener on a free port
    beside its plain port-per-broker listeners, and that listener as clients see it."""
    port = free_port()
    sni = {
        "port": port,
        "bootstrap": BOOTSTRAP_NAME,
        "brokers": BROKER_NAMES,
        "tls": {"cert_file": str(tls.server_cert), "key_file": str(tls.server_key)},
    }
    proxy = ProxyProcess.in_front_of(directory, servers, listen={"sni": sni})
    return proxy, SniEndpoint(port, tls.ca)


@contextlib.contextmanager
def running_sni_proxy(
    directory: Path,
    servers: list[str],
    tls: TlsFiles,
    *,
    arguments: tuple[str, ...] = (),
    lowest_node_id: int | None = None,
) -> Iterator[tuple[ProxyProcess, SniEndpoint]]:
    """`sni_proxy` started (with more `serve` `arguments`), serving TLS on its SNI port, and
    stopped on exit."""
    proxy, sni = sni_proxy(directory, servers, tls)
    proxy.arguments = arguments
    if lowest_node_id is not None:
        proxy.config["listen"]["lowest_node_id"] = lowest_node_id
        proxy.config_path.write_text(yaml.safe_dump(proxy.config))
    try:
        proxy.start()
        wait_for_sni(sni)
        yield proxy, sni
    finally:
        proxy.close()


def wait_for_sni(endpoint: SniEndpoint, timeout: float = 30) -> None:
    """Until a TLS handshake naming the bootstrap completes on the SNI port."""
    context = ssl.create_default_context(cafile=str(endpoint.ca))

    def handshake() -> bool:
        with (
            contextlib.suppress(OSError),
            socket.create_connection((HOST, endpoint.port), timeout=2) as raw,
            context.wrap_socket(raw, server_hostname=BOOTSTRAP_NAME),
        ):
            return True
        return False

    wait_until(handshake, f"a TLS handshake on the SNI port {endpoint.port}", timeout)


def accepted_connections(proxy: ServesMetrics) -> Counter[tuple[str, str]]:
    """Client connections the proxy accepted so far, by (listener, node)
    (`kvproxy_client_connections_accepted_total`)."""
    counts: Counter[tuple[str, str]] = Counter()
    for (name, labels), count in scrape(proxy).items():
        if name == "kvproxy_client_connections_accepted_total":
            by_name = dict(labels)
            counts[by_name["listener"], by_name["node"]] = int(count)
    return counts
