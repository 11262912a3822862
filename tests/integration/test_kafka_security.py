"""SASL and TLS through kvproxy to Apache Kafka listeners that require them.

The broker (tests/harness/kafka_security.py) has a PLAINTEXT listener (inter-broker, and the
test's own topic creation), a SASL_PLAINTEXT and a SASL_SSL listener, each offering PLAIN,
SCRAM-SHA-256 and SCRAM-SHA-512, with users the broker itself holds. kvproxy's upstream is one
of the SASL listeners; clients log in through the proxy with their own credentials, which the
proxy passes through. Two certificate authorities: the brokers' (only kvproxy trusts it) and
kvproxy's (clients trust it; it also signs the client certificates of mutual TLS), so a client
that gets through has spoken TLS to kvproxy and kvproxy to Kafka.
"""

from __future__ import annotations

import contextlib
import logging
import re
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.harness.clients import confluent_send
from tests.harness.kafka_broker import KAFKA_3, KAFKA_4, KafkaCluster, run_kafka
from tests.harness.kafka_security import (
    MECHANISMS,
    SECURE_LISTENERS,
    broker_properties,
    console_consume,
    console_produce,
    consumed_records,
    java_properties,
    keystore_pem,
    librdkafka_settings,
    sasl_authenticate_answer,
    scram_format_arguments,
    write_properties,
)
from tests.harness.metrics import CLOSED, get, scrape, value
from tests.harness.proxy import RunningProxy, run_proxy
from tests.harness.tls import TlsFiles, write_tls_files

SASL_AUTHENTICATE = 36
SASL_AUTHENTICATION_FAILED = 58
KAFKA_MESSAGES = {
    "PLAIN": "Authentication failed: Invalid username or password",
    "SCRAM-SHA-256": "Authentication failed during authentication due to invalid credentials "
    "with SASL mechanism SCRAM-SHA-256",
    "SCRAM-SHA-512": "Authentication failed during authentication due to invalid credentials "
    "with SASL mechanism SCRAM-SHA-512",
}
"""What Kafka answers a wrong password with (SaslAuthenticate's error_message)."""
SASL_HANDSHAKE = 17
REAUTH_PROPERTY = "listener.name.sasl_ssl.scram-sha-512.connections.max.reauth.ms"
REAUTH_MS = 2000
"""Session lifetime of SCRAM-SHA-512 logins on the 4.x broker's SASL_SSL listener (KIP-368)."""


@dataclass
class SecureKafka:
    cluster: KafkaCluster
    kafka_tls: TlsFiles
    """The brokers' certificate and CA: only kvproxy trusts it."""
    proxy_tls: TlsFiles
    """kvproxy's listener certificate, its CA (clients trust it) and a client certificate."""
    directory: Path

    def address(self, listener: str) -> str:
        return f"127.0.0.1:{self.cluster.brokers[0].ports[listener]}"

    def addresses(self, listener: str) -> list[str]:
        return [f"127.0.0.1:{broker.ports[listener]}" for broker in self.cluster.brokers]

    @contextlib.contextmanager
    def proxy(self, listener: str, *, mutual: bool = False, **extra: Any) -> Iterator[RunningProxy]:
        """kvproxy in front of ``listener``: TLS on both sides for SASL_SSL (``mutual``: clients
        must present a certificate signed by kvproxy's CA), plain TCP for SASL_PLAINTEXT."""
        sections: dict[str, Any] = {}
        if listener == "SASL_SSL":
            tls = {"cert_file": str(self.proxy_tls.server_cert)}
            tls["key_file"] = str(self.proxy_tls.server_key)
            if mutual:
                tls["client_ca_file"] = str(self.proxy_tls.ca)
            sections = {
                "listen": {"tls": tls},
                "upstream": {"tls": {"ca_file": str(self.kafka_tls.ca)}},
            }
        with run_proxy(self.addresses(listener), **sections, **extra) as proxy:
            yield proxy

    def client(self, listener: str, mechanism: str, password: str, **extra: Any) -> dict[str, str]:
        """librdkafka settings for a client of :meth:`proxy` (``ca`` is kvproxy's CA)."""
        ca = self.proxy_tls.ca if listener == "SASL_SSL" else None
        return librdkafka_settings(mechanism, password, ca=ca, **extra)


@contextlib.contextmanager
def secure_kafka(
    version: str, directory: Path, brokers: int = 1, **properties: str
) -> Iterator[SecureKafka]:
    kafka_tls = write_tls_files(directory / "kafka-ca")
    proxy_tls = write_tls_files(directory / "proxy-ca")
    with run_kafka(
        version,
        brokers=brokers,
        listeners=SECURE_LISTENERS,
        properties={**broker_properties(kafka_tls, directory), **properties},
        format_arguments=scram_format_arguments(),
    ) as cluster:
        yield SecureKafka(cluster, kafka_tls, proxy_tls, directory)


def round_trip(
    bootstrap: str, topic: str, settings: dict[str, str], count: int = 5, partitions: int = 1
) -> tuple[dict[int, list[bytes]], dict[int, str]]:
    """Produce ``count`` values to each partition with confluent-kafka (idempotent, acks=all),
    read them back from the beginning; return the values read by partition and the brokers the
    consumer's Metadata named."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, **settings})
    delivered: list[object] = []
    for partition in range(partitions):
        for n in range(count):
            producer.produce(
                topic,
                b"secret-%d" % n,
                partition=partition,
                on_delivery=lambda e, m: delivered.append(e),
            )
    assert producer.flush(30) == 0
    assert delivered == [None] * count * partitions
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "sec", "enable.auto.commit": False, **settings}
    )
    got: dict[int, list[bytes]] = {partition: [] for partition in range(partitions)}
    try:
        consumer.assign([TopicPartition(topic, partition, 0) for partition in range(partitions)])
        deadline = time.monotonic() + 30
        while sum(map(len, got.values())) < count * partitions and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                got[message.partition()].append(message.value())
        brokers = {
            b.id: f"{b.host}:{b.port}"
            for b in consumer.list_topics(topic, timeout=10).brokers.values()
        }
    finally:
        consumer.close()
    return got, brokers


def authentication_error(bootstrap: str, settings: dict[str, str]) -> tuple[Any, str]:
    """The first error a librdkafka producer with these settings reports (error_cb), and the
    broker's reason inside its text."""
    from confluent_kafka import KafkaError, Producer

    errors: list[Any] = []
    producer = Producer({"bootstrap.servers": bootstrap, **settings, "error_cb": errors.append})
    deadline = time.monotonic() + 30
    while not errors and time.monotonic() < deadline:
        producer.poll(0.2)
    assert errors, "no error reported"
    error = errors[0]
    assert error.code() == KafkaError._AUTHENTICATION, error
    found = re.search(r"SASL authentication error: (.*) \(after \d+ms", error.str())
    assert found, error.str()
    return error, found.group(1)


@pytest.fixture(scope="class")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureKafka]:
    """Kafka 4.x for the tests of one class: stopped before the 3.9 test starts its own."""
    reauth = {REAUTH_PROPERTY: str(REAUTH_MS)}  # SCRAM-SHA-512 on SASL_SSL only
    with secure_kafka(KAFKA_4, tmp_path_factory.mktemp("kafka-security"), **reauth) as secured:
        yield secured


@pytest.mark.kafka
@pytest.mark.xdist_group("kafka_security")
class TestKafka4:
    """Apache Kafka 4.x, one node."""

    @pytest.mark.parametrize("listener", ["SASL_PLAINTEXT", "SASL_SSL"])
    @pytest.mark.parametrize("mechanism", MECHANISMS)
    def test_librdkafka_logs_in_produces_and_consumes(
        self, secured: SecureKafka, mechanism: str, listener: str
    ) -> None:
        topic = secured.cluster.create_topic()
        with secured.proxy(listener) as proxy:
            settings = secured.client(listener, mechanism, "alice-secret")
            got, brokers = round_trip(proxy.bootstrap, topic, settings)
            assert got == {0: [b"secret-%d" % n for n in range(5)]}
            # The client only ever learned kvproxy's address; kvproxy reached the broker on the
            # listener it was given (Kafka names, in Metadata, the listener asked on).
            assert brokers == {1: f"127.0.0.1:{proxy.broker_port(1)}"}
            assert proxy.nodes == {1: ("127.0.0.1", secured.cluster.brokers[0].ports[listener])}

    def test_sessions_reauthenticate_through_the_proxy(self, secured: SecureKafka) -> None:
        """Kafka gives SCRAM-SHA-512 sessions on SASL_SSL a 2 s lifetime (KIP-368): librdkafka
        logs in again on the same connections (SaslHandshake and SaslAuthenticate between its
        Produce requests), and keeps producing without a disconnect."""
        from confluent_kafka import Producer

        topic = secured.cluster.create_topic()
        with secured.proxy("SASL_SSL") as proxy:
            settings = secured.client("SASL_SSL", "SCRAM-SHA-512", "alice-secret")
            errors: list[Any] = []
            producer = Producer(
                {"bootstrap.servers": proxy.bootstrap, **settings, "error_cb": errors.append}
            )
            delivered: list[Any] = []

            def handshakes() -> int:
                return sum(1 for key, _, _ in list(proxy.responses) if key == SASL_HANDSHAKE)

            producer.produce(topic, b"first", on_delivery=lambda e, m: delivered.append(e))
            assert producer.flush(30) == 0
            logins = handshakes()
            deadline = time.monotonic() + 60
            while handshakes() < logins + 2 and time.monotonic() < deadline:
                producer.poll(0.2)
            assert handshakes() >= logins + 2  # two sessions renewed (or one, twice)
            producer.produce(topic, b"after", on_delivery=lambda e, m: delivered.append(e))
            assert producer.flush(30) == 0
            assert delivered == [None, None]
            assert errors == []
            closed = scrape(proxy)
            assert value(closed, CLOSED, reason="upstream_closed") == 0
            assert value(closed, CLOSED, reason="upstream_error") == 0
            logins_done = [
                sasl_authenticate_answer(version, frame)
                for key, version, frame in list(proxy.responses)
                if key == SASL_AUTHENTICATE
            ]
            # SCRAM takes two rounds; the last one of each login says how long it holds.
            assert {a.session_lifetime_ms for a in logins_done if a.error_code == 0} >= {REAUTH_MS}

    @pytest.mark.parametrize("declared", [False, True])
    def test_sasl_only_upstream_ready_and_compaction_as_documented(
        self, secured: SecureKafka, caplog: pytest.LogCaptureFixture, declared: bool
    ) -> None:
        """kvproxy's own requests do not authenticate (docs/operations.md, "SASL"): in front of
        a SASL-only listener it says so once and is ready anyway, and cannot learn that a topic
        is compacted. A null key there is still refused with INVALID_RECORD (87), by Kafka; by
        kvproxy's compacted_key check once the topic is declared ``compacted: true``."""
        from confluent_kafka import KafkaError

        topic = secured.cluster.create_topic(partitions=2, config={"cleanup.policy": "compact"})
        topics = [{"match": topic, "compacted": True}] if declared else []
        settings = secured.client("SASL_SSL", "SCRAM-SHA-256", "alice-secret")
        with (
            caplog.at_level(logging.WARNING, logger="kvproxy"),
            secured.proxy("SASL_SSL", topics=topics) as proxy,
        ):
            deadline = time.monotonic() + 30
            while get(f"{proxy.metrics_url}/readyz")[0] != 200 and time.monotonic() < deadline:
                time.sleep(0.1)  # polled: readiness is re-checked every second
            assert get(f"{proxy.metrics_url}/readyz")[0] == 200
            assert "closed the connection on Metadata" in caplog.text
            assert "a listener that requires authentication?" in caplog.text
            bad, good = confluent_send(
                proxy.bootstrap, topic, {"value": b"v"}, {"key": b"k", "value": b"v"}, **settings
            )
            assert good is None
            assert bad is not None
            assert bad.code() == KafkaError.INVALID_RECORD
            refused_here = value(
                scrape(proxy),
                "kvproxy_policy_rejections_total",
                topic=topic,
                policy="compacted_key",
                code="87",
            )
            assert refused_here == (1 if declared else 0)

    @pytest.mark.parametrize("mechanism", MECHANISMS)
    def test_wrong_password_is_kafkas_authentication_error(
        self, secured: SecureKafka, mechanism: str
    ) -> None:
        listener = "SASL_SSL"
        direct = librdkafka_settings(mechanism, "wrong", ca=secured.kafka_tls.ca)
        _, said_direct = authentication_error(secured.address(listener), direct)
        with secured.proxy(listener) as proxy:
            error, said = authentication_error(
                proxy.bootstrap, secured.client(listener, mechanism, "wrong")
            )
            assert said == said_direct == KAFKA_MESSAGES[mechanism]
            assert not error.retriable()
            # On the wire: Kafka's SaslAuthenticate answer, relayed as it came.
            answers = [
                sasl_authenticate_answer(version, frame)
                for key, version, frame in list(proxy.responses)
                if key == SASL_AUTHENTICATE
            ]
            failures = {answer[:2] for answer in answers if answer.error_code != 0}
            assert failures == {(SASL_AUTHENTICATION_FAILED, KAFKA_MESSAGES[mechanism])}
            stats = proxy.wait_until_idle()
            assert stats.upstream_connections == 0  # Kafka closed them; kvproxy followed

    def test_java_console_tools_with_scram_over_mutual_tls(
        self, secured: SecureKafka, tmp_path: Path
    ) -> None:
        """Kafka's own console producer and consumer (the Java client) with SCRAM-SHA-256 and a
        client certificate: records typed in come out."""
        topic = secured.cluster.create_topic()
        keystore = keystore_pem(
            secured.proxy_tls.client_cert, secured.proxy_tls.client_key, tmp_path / "client.pem"
        )
        config = write_properties(
            tmp_path / "client.properties",
            java_properties(
                "SCRAM-SHA-256", "alice-secret", ca=secured.proxy_tls.ca, keystore=keystore
            ),
        )
        lines = ["first record", "second record", "third record"]
        with secured.proxy("SASL_SSL", mutual=True) as proxy:
            produced = console_produce(KAFKA_4, proxy.bootstrap, topic, config, lines)
            assert produced.returncode == 0, produced.stderr[-3000:]
            consumed = console_consume(KAFKA_4, proxy.bootstrap, topic, config, len(lines))
            assert consumed.returncode == 0, consumed.stderr[-3000:]
            assert consumed_records(consumed.stdout) == [
                (0, n, line) for n, line in enumerate(lines)
            ]
            assert "Processed a total of 3 messages" in consumed.stderr

    def test_java_wrong_password_is_a_sasl_authentication_exception(
        self, secured: SecureKafka, tmp_path: Path
    ) -> None:
        topic = secured.cluster.create_topic()
        config = write_properties(
            tmp_path / "client.properties",
            java_properties("SCRAM-SHA-256", "wrong", ca=secured.proxy_tls.ca),
        )
        with secured.proxy("SASL_SSL") as proxy:
            produced = console_produce(KAFKA_4, proxy.bootstrap, topic, config, ["never stored"])
        output = produced.stdout + produced.stderr
        assert (
            "org.apache.kafka.common.errors.SaslAuthenticationException: "
            + KAFKA_MESSAGES["SCRAM-SHA-256"]
        ) in output, output[-3000:]
        assert produced.returncode != 0

    def test_mutual_tls_refuses_a_client_without_a_certificate(self, secured: SecureKafka) -> None:
        """librdkafka without a certificate, refused by kvproxy's mutual TLS listener, is told
        why: TLS's "certificate required" alert (as from a Kafka listener with
        ``ssl.client.auth=required``), not a bare close. Nothing reaches Kafka."""
        from confluent_kafka import KafkaError, Producer

        with secured.proxy("SASL_SSL", mutual=True) as proxy:
            errors: list[Any] = []
            settings = secured.client("SASL_SSL", "SCRAM-SHA-512", "alice-secret")
            producer = Producer(
                {"bootstrap.servers": proxy.bootstrap, **settings, "error_cb": errors.append}
            )
            deadline = time.monotonic() + 30
            while not errors and time.monotonic() < deadline:
                producer.poll(0.2)
            assert errors
            assert errors[0].code() == KafkaError._TRANSPORT, errors[0]
            assert "tlsv13 alert certificate required" in errors[0].str()
            assert proxy.stats().upstream_connections == 0
            assert not proxy.responses  # nothing relayed
            del producer

    def test_java_without_a_client_certificate_fails_the_handshake(
        self, secured: SecureKafka, tmp_path: Path
    ) -> None:
        """A Java client kvproxy's mutual TLS listener refuses learns why at once, as from a
        Kafka listener with ``ssl.client.auth=required``: SslAuthenticationException (not
        retried; with TLS 1.3 "Failed to process post-handshake messages"), instead of
        reconnecting until ``max.block.ms`` runs out."""
        topic = secured.cluster.create_topic()
        settings = java_properties("SCRAM-SHA-256", "alice-secret", ca=secured.proxy_tls.ca)
        config = write_properties(
            tmp_path / "client.properties", {**settings, "max.block.ms": "20000"}
        )
        with secured.proxy("SASL_SSL", mutual=True) as proxy:
            produced = console_produce(KAFKA_4, proxy.bootstrap, topic, config, ["refused"])
            assert proxy.stats().upstream_connections == 0
        output = produced.stdout + produced.stderr
        assert produced.returncode != 0
        assert (
            "org.apache.kafka.common.errors.SslAuthenticationException: "
            "Failed to process post-handshake messages"
        ) in output, output[-3000:]
        assert (
            "javax.net.ssl.SSLHandshakeException: Received fatal alert: certificate_required"
            in output
        )
        assert "TimeoutException" not in output


@pytest.mark.kafka
@pytest.mark.xdist_group("kafka_security")
def test_kafka_3_scram_sha_512_over_tls(tmp_path: Path) -> None:
    """Apache Kafka 3.9: SCRAM-SHA-512 over SASL_SSL with librdkafka and with 3.9's own console
    tools; a wrong PLAIN password gets Kafka's message."""
    with secure_kafka(KAFKA_3, tmp_path) as secured, secured.proxy("SASL_SSL") as proxy:
        topic = secured.cluster.create_topic()
        settings = secured.client("SASL_SSL", "SCRAM-SHA-512", "alice-secret")
        got, brokers = round_trip(proxy.bootstrap, topic, settings)
        assert got == {0: [b"secret-%d" % n for n in range(5)]}
        assert brokers == {1: f"127.0.0.1:{proxy.broker_port(1)}"}
        _, said = authentication_error(proxy.bootstrap, secured.client("SASL_SSL", "PLAIN", "x"))
        assert said == KAFKA_MESSAGES["PLAIN"]
        config = write_properties(
            tmp_path / "client.properties",
            java_properties("SCRAM-SHA-512", "bob-secret", user="bob", ca=secured.proxy_tls.ca),
        )
        produced = console_produce(KAFKA_3, proxy.bootstrap, topic, config, ["from java"])
        assert produced.returncode == 0, produced.stderr[-3000:]
        consumed = console_consume(KAFKA_3, proxy.bootstrap, topic, config, 6)
        assert consumed.returncode == 0, consumed.stderr[-3000:]
        values = [value for _, _, value in consumed_records(consumed.stdout)]
        assert values == [f"secret-{n}" for n in range(5)] + ["from java"]


@pytest.mark.kafka
@pytest.mark.xdist_group("kafka_security")
def test_three_brokers_behind_one_proxy_over_sasl_ssl(tmp_path: Path) -> None:
    """Three Kafka 4.x brokers, each reached on its SASL_SSL listener through its own kvproxy
    port: partitions led by different brokers take SCRAM-SHA-512 clients' records."""
    with (
        secure_kafka(KAFKA_4, tmp_path, brokers=3) as secured,
        secured.proxy("SASL_SSL") as proxy,
    ):
        topic = secured.cluster.create_topic(partitions=3)
        leaders = {secured.cluster.leader_of(topic, partition) for partition in range(3)}
        assert leaders == {1, 2, 3}
        settings = secured.client("SASL_SSL", "SCRAM-SHA-512", "bob-secret", user="bob")
        got, brokers = round_trip(proxy.bootstrap, topic, settings, partitions=3)
        assert got == {p: [b"secret-%d" % n for n in range(5)] for p in range(3)}
        assert brokers == {n: f"127.0.0.1:{proxy.broker_port(n)}" for n in (1, 2, 3)}
        assert proxy.nodes == {
            broker.node_id: ("127.0.0.1", broker.ports["SASL_SSL"])
            for broker in secured.cluster.brokers
        }


def test_a_refused_handshake_sends_its_alert(tmp_path: Path) -> None:
    """kvproxy's mutual TLS listener tells a refused client why, with the alert OpenSSL (and a
    Kafka listener) sends: certificate required, unknown CA. Bytes that are not TLS at all are
    still closed at once. No broker needed: nothing gets past the handshake."""
    tls = write_tls_files(tmp_path / "proxy-ca")
    other = write_tls_files(tmp_path / "other-ca")
    listen = {
        "tls": {
            "cert_file": str(tls.server_cert),
            "key_file": str(tls.server_key),
            "client_ca_file": str(tls.ca),
        }
    }

    def refusal(context: ssl.SSLContext) -> ssl.SSLError:
        with socket.create_connection((proxy.host, proxy.port), timeout=10) as raw:
            secure = context.wrap_socket(raw, server_hostname="127.0.0.1")
            with pytest.raises(ssl.SSLError) as refused:
                secure.sendall(b"\x00\x00\x00\x0a\x00\x12\x00\x00\x00\x00\x00\x01\x00\x00")
                secure.recv(4096)
            return refused.value

    with run_proxy("127.0.0.1:1", listen=listen) as proxy:  # no cluster behind it
        assert refusal(tls.client_context()).reason == "TLSV13_ALERT_CERTIFICATE_REQUIRED"
        foreign = tls.client_context()
        foreign.load_cert_chain(other.client_cert, other.client_key)
        assert refusal(foreign).reason == "TLSV1_ALERT_UNKNOWN_CA"
        with socket.create_connection((proxy.host, proxy.port), timeout=10) as plain:
            plain.sendall(b"\x00\x00\x00\x0a\x00\x12\x00\x00\x00\x00\x00\x01\x00\x00")
            assert plain.recv(4096) == b""
        assert proxy.stats().upstream_connections == 0
