"""kvproxy's SNI listener beside its port-per-broker listeners, in one proxy, in front of Apache
Kafka 4.4 (one node with a PLAINTEXT, a SASL_PLAINTEXT and a SASL_SSL listener,
tests/harness/kafka_security.py).

What a user sees: a confluent-kafka client bootstrapped at the port-per-broker bootstrap is told
`127.0.0.1:<broker port>`, one bootstrapped at the SNI name is told `broker-1.kafka.localhost:<SNI
port>`; both produce, and each reads the other's records; the proxy counts their connections under
each listener. With SASL inside (the proxy's upstream the SASL_PLAINTEXT listener), the right
credentials produce and consume through the SNI port, and a wrong password gets the same
authentication error, Kafka's words, through the SNI port as through the port-per-broker one
(confluent-kafka with PLAIN and SCRAM-SHA-256; the Java client with SCRAM-SHA-256).
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.harness.java_client import run_java_client
from tests.harness.kafka_broker import KAFKA_4, KafkaCluster, run_kafka
from tests.harness.kafka_security import (
    SECURE_LISTENERS,
    broker_properties,
    java_properties,
    librdkafka_settings,
    scram_format_arguments,
)
from tests.harness.proxy import RunningProxy, run_proxy
from tests.harness.proxy_process import HOST, ProxyProcess
from tests.harness.sni import (
    BOOTSTRAP_NAME,
    BROKER_NAMES,
    JAVA_IPV4,
    SniEndpoint,
    accepted_connections,
    sni_proxy,
    wait_for_sni,
)
from tests.harness.tansu import free_port
from tests.harness.tls import TlsFiles, write_tls_files

pytestmark = [pytest.mark.kafka, pytest.mark.xdist_group("sni_modes"), pytest.mark.timeout(300)]

KAFKA_MESSAGES = {
    "PLAIN": "Authentication failed: Invalid username or password",
    "SCRAM-SHA-256": "Authentication failed during authentication due to invalid credentials "
    "with SASL mechanism SCRAM-SHA-256",
}
"""What Kafka answers a wrong password with (SaslAuthenticate's error_message)."""


@dataclass
class Secured:
    cluster: KafkaCluster
    proxy_tls: TlsFiles
    """kvproxy's certificate (127.0.0.1 and *.kafka.localhost) and the CA clients trust."""
    directory: Path

    def address(self, listener: str) -> str:
        return f"{HOST}:{self.cluster.brokers[0].ports[listener]}"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    directory = tmp_path_factory.mktemp("sni-modes")
    kafka_tls = write_tls_files(directory / "kafka-ca")
    proxy_tls = write_tls_files(directory / "proxy-ca", hostnames=("*.kafka.localhost",))
    with run_kafka(
        KAFKA_4,
        listeners=SECURE_LISTENERS,
        properties=broker_properties(kafka_tls, directory),
        format_arguments=scram_format_arguments(),
    ) as cluster:
        yield Secured(cluster, proxy_tls, directory)


def broker_port(proxy: ProxyProcess, node_id: int) -> int:
    """The port-per-broker port of `node_id` (`broker_port_base + N - lowest_node_id`)."""
    listen = proxy.config["listen"]
    return int(listen["broker_port_base"]) + node_id - int(listen["lowest_node_id"])


def produce(settings: dict[str, Any], topic: str, values: list[bytes]) -> dict[int, str]:
    """Produce `values` (acks=all) and wait for each to be delivered; the brokers the producer's
    Metadata named (node id: host:port)."""
    from confluent_kafka import Producer

    producer = Producer({**settings, "acks": "all", "message.timeout.ms": 30000})
    errors: list[Any] = []
    for value in values:
        producer.produce(topic, value, b"k", on_delivery=lambda e, _m: errors.append(e))
    assert producer.flush(45) == 0
    assert errors == [None] * len(values)
    brokers = producer.list_topics(timeout=15).brokers
    return {n: f"{b.host}:{b.port}" for n, b in brokers.items()}


def consume(settings: dict[str, Any], topic: str) -> list[bytes]:
    """Every value of partition 0 of `topic`, from the beginning to the end."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            **settings,
            "group.id": f"sni-modes-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    values: list[bytes] = []
    at_end = False
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + 60
        while not at_end and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            error = message.error()
            if error is None:
                values.append(message.value())
            else:
                assert error.code() == KafkaError._PARTITION_EOF, error
                at_end = True
    finally:
        consumer.close()
    assert at_end, f"the consumer did not reach the end of {topic}: {values}"
    return values


def test_both_modes_at_once_serve_the_same_cluster(secured: Secured) -> None:
    """One proxy, plain port-per-broker listeners and the SNI listener: a client of each mode is
    told its own mode's addresses, and each reads what the other produced."""
    directory = secured.directory / "both-modes"
    directory.mkdir()
    proxy, sni = sni_proxy(directory, [secured.address("PLAINTEXT")], secured.proxy_tls)
    topic = secured.cluster.create_topic()
    try:
        proxy.start()
        wait_for_sni(sni)
        by_port = {"bootstrap.servers": proxy.bootstrap}
        by_name = sni.librdkafka()

        named = produce(by_port, topic, [b"by-port-0", b"by-port-1"])
        assert named == {1: f"{HOST}:{broker_port(proxy, 1)}"}
        named = produce(by_name, topic, [b"by-name-0", b"by-name-1"])
        assert named == {1: sni.broker_address(1)}
        assert named == {1: f"broker-1.kafka.localhost:{sni.port}"}

        everything = [b"by-port-0", b"by-port-1", b"by-name-0", b"by-name-1"]
        assert consume(by_name, topic) == everything
        assert consume(by_port, topic) == everything

        accepted = accepted_connections(proxy)
        assert {key for key, count in accepted.items() if count > 0} == {
            ("bootstrap", "bootstrap"),
            ("broker", "1"),
            ("sni", "bootstrap"),
            ("sni", "1"),
        }, accepted
    finally:
        proxy.close()


@pytest.fixture(scope="module")
def sasl_proxy(secured: Secured) -> Iterator[tuple[RunningProxy, SniEndpoint]]:
    """kvproxy in front of Kafka's SASL_PLAINTEXT listener: TLS port-per-broker listeners and
    the SNI listener, both with kvproxy's certificate; SASL passes through inside TLS."""
    tls = {"cert_file": str(secured.proxy_tls.server_cert)}
    tls["key_file"] = str(secured.proxy_tls.server_key)
    sni = {"port": free_port(), "bootstrap": BOOTSTRAP_NAME, "brokers": BROKER_NAMES}
    endpoint = SniEndpoint(sni["port"], secured.proxy_tls.ca)
    with run_proxy(
        secured.address("SASL_PLAINTEXT"), listen={"tls": tls, "sni": sni}, max_brokers=10
    ) as proxy:
        wait_for_sni(endpoint)
        yield proxy, endpoint


def sasl_through_sni(sni: SniEndpoint, mechanism: str, password: str) -> dict[str, str]:
    """A client of the SNI port with SASL inside TLS (SASL_SSL to kvproxy)."""
    return {**sni.librdkafka(), **librdkafka_settings(mechanism, password, ca=sni.ca)}


def sasl_through_ports(
    proxy: RunningProxy, ca: Path, mechanism: str, password: str
) -> dict[str, str]:
    """A client of the port-per-broker bootstrap with SASL inside TLS."""
    return {"bootstrap.servers": proxy.bootstrap, **librdkafka_settings(mechanism, password, ca=ca)}


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_sasl_client_produces_and_consumes_through_the_sni_port(
    secured: Secured, sasl_proxy: tuple[RunningProxy, SniEndpoint], mechanism: str
) -> None:
    proxy, sni = sasl_proxy
    topic = secured.cluster.create_topic()
    before = accepted_connections(proxy)
    settings = sasl_through_sni(sni, mechanism, "alice-secret")
    values = [f"{mechanism}-{n}".encode() for n in range(3)]
    assert produce(settings, topic, values) == {1: sni.broker_address(1)}
    assert consume(settings, topic) == values
    accepted = accepted_connections(proxy) - before
    assert {listener for listener, _node in accepted} == {"sni"}, accepted
    assert {node for _listener, node in accepted} == {"bootstrap", "1"}, accepted


def authentication_error(settings: dict[str, str]) -> tuple[Any, str]:
    """The first error a librdkafka producer with these settings reports (error_cb), and the
    broker's reason inside its text."""
    from confluent_kafka import KafkaError, Producer

    errors: list[Any] = []
    producer = Producer({**settings, "error_cb": errors.append})
    deadline = time.monotonic() + 30
    while not errors and time.monotonic() < deadline:
        producer.poll(0.2)
    assert errors, "no error reported"
    error = errors[0]
    assert error.code() == KafkaError._AUTHENTICATION, error
    found = re.search(r"SASL authentication error: (.*) \(after \d+ms", error.str())
    assert found, error.str()
    return error, found.group(1)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_wrong_password_through_the_sni_port_is_the_same_authentication_error(
    secured: Secured, sasl_proxy: tuple[RunningProxy, SniEndpoint], mechanism: str
) -> None:
    proxy, sni = sasl_proxy
    by_port, said_by_port = authentication_error(
        sasl_through_ports(proxy, secured.proxy_tls.ca, mechanism, "wrong")
    )
    by_name, said_by_name = authentication_error(sasl_through_sni(sni, mechanism, "wrong"))
    assert said_by_name == said_by_port == KAFKA_MESSAGES[mechanism]
    assert (by_name.code(), by_name.retriable(), by_name.fatal()) == (
        by_port.code(),
        by_port.retriable(),
        by_port.fatal(),
    )
    assert not by_name.retriable()


def java_produce(
    bootstrap: str, sni: SniEndpoint, topic: str, password: str, values: list[str]
) -> list[dict[str, Any]]:
    """The Java client's SCRAM-SHA-256 producer inside TLS (trusting kvproxy's CA, host names
    verified): what became of each value."""
    props = {**sni.java(), **java_properties("SCRAM-SHA-256", password, ca=sni.ca)}
    run = run_java_client(
        "produce", bootstrap, props=props, jvm=JAVA_IPV4, topic=topic, values="\n".join(values)
    )
    results: list[dict[str, Any]] = run.result["results"]
    return results


def test_java_client_through_the_sni_port_as_through_the_port_per_broker_listener(
    secured: Secured, sasl_proxy: tuple[RunningProxy, SniEndpoint]
) -> None:
    """The right password produces and consumes through the SNI port; a wrong one is the same
    SaslAuthenticationException, with Kafka's message, through either listener."""
    proxy, sni = sasl_proxy
    topic = secured.cluster.create_topic()
    values = ["java-0", "java-1"]
    produced = java_produce(sni.bootstrap, sni, topic, "alice-secret", values)
    assert [(r.get("error"), r.get("partition")) for r in produced] == [(None, 0)] * len(values)
    props = {**sni.java(), **java_properties("SCRAM-SHA-256", "alice-secret", ca=sni.ca)}
    group = f"sni-modes-{uuid.uuid4().hex[:8]}"
    consumed = run_java_client(
        "consume", sni.bootstrap, props=props, jvm=JAVA_IPV4, topic=topic, group=group
    ).result["members"]
    assert [value for member in consumed for _key, value, _p, _o in member["records"]] == values

    [by_name] = java_produce(sni.bootstrap, sni, topic, "wrong", ["never stored"])
    [by_port] = java_produce(proxy.bootstrap, sni, topic, "wrong", ["never stored"])
    refused = {
        "class": "org.apache.kafka.common.errors.SaslAuthenticationException",
        "message": KAFKA_MESSAGES["SCRAM-SHA-256"],
    }
    assert by_name["error"] == by_port["error"] == refused
