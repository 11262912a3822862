"""TLS on both sides of the proxy, with certificates made for the test."""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Iterator

import pytest

from tests.harness import Broker, create_topic, run_tansu, unique_topic_name
from tests.harness.proxy import run_proxy
from tests.harness.tls import TlsFiles, make_tls_files
from tests.harness.tls_relay import run_tls_relay


@pytest.fixture(scope="module")
def tls() -> Iterator[TlsFiles]:
    with make_tls_files() as files:
        yield files


def _produce_and_consume(bootstrap: str, topic: str, extra: dict[str, str]) -> list[bytes]:
    from confluent_kafka import Consumer, Producer, TopicPartition

    producer = Producer({"bootstrap.servers": bootstrap, **extra})
    for i in range(5):
        producer.produce(topic, b"secret-%d" % i, partition=0)
    assert producer.flush(20) == 0
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "tls", "enable.auto.commit": False, **extra}
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + 20
    while len(got) < 5 and time.monotonic() < deadline:
        message = consumer.poll(1)
        if message is not None and message.error() is None:
            got.append(message.value())
    consumer.close()
    return got


def test_clients_connect_over_tls(tansu: Broker, topic: str, tls: TlsFiles) -> None:
    listen = {"tls": {"cert_file": str(tls.server_cert), "key_file": str(tls.server_key)}}
    with run_proxy(tansu.bootstrap, listen=listen) as proxy:
        ssl_settings = {"security.protocol": "SSL", "ssl.ca.location": str(tls.ca)}
        assert _produce_and_consume(proxy.bootstrap, topic, ssl_settings) == [
            b"secret-%d" % i for i in range(5)
        ]
        # A plain-text client gets no Kafka answer from a TLS listener.
        with socket.create_connection((proxy.host, proxy.port), timeout=5) as plain:
            plain.sendall(b"\x00\x00\x00\x0a\x00\x12\x00\x00\x00\x00\x00\x01\x00\x00")
            assert not plain.recv(4096).startswith(b"\x00\x00\x00")
        # A TLS client that does not trust the proxy's CA fails the handshake.
        untrusting = ssl.create_default_context()
        with (
            socket.create_connection((proxy.host, proxy.port), timeout=5) as raw,
            pytest.raises(ssl.SSLCertVerificationError),
        ):
            untrusting.wrap_socket(raw, server_hostname="127.0.0.1")


def test_mutual_tls_requires_a_client_certificate(tansu: Broker, topic: str, tls: TlsFiles):
    listen = {
        "tls": {
            "cert_file": str(tls.server_cert),
            "key_file": str(tls.server_key),
            "client_ca_file": str(tls.ca),
        }
    }
    with run_proxy(tansu.bootstrap, listen=listen) as proxy:
        with_cert = {
            "security.protocol": "SSL",
            "ssl.ca.location": str(tls.ca),
            "ssl.certificate.location": str(tls.client_cert),
            "ssl.key.location": str(tls.client_key),
        }
        assert len(_produce_and_consume(proxy.bootstrap, topic, with_cert)) == 5
        context = tls.client_context(with_client_cert=False)
        with socket.create_connection((proxy.host, proxy.port), timeout=5) as raw:
            secure = context.wrap_socket(raw, server_hostname="127.0.0.1")
            secure.sendall(b"\x00\x00\x00\x0a\x00\x12\x00\x00\x00\x00\x00\x01\x00\x00")
            with pytest.raises((ssl.SSLError, ConnectionError)):
                if not secure.recv(4096):
                    raise ConnectionError("closed without an answer")


def test_proxy_speaks_tls_to_its_upstream(tls: TlsFiles) -> None:
    relay_socket = socket.socket()
    relay_socket.bind(("127.0.0.1", 0))
    relay_port = relay_socket.getsockname()[1]
    with run_tansu(advertised_port=relay_port) as server:
        broker = server.broker
        with run_tls_relay(relay_socket, (broker.host, broker.port), tls.server_context()):
            upstream = {"tls": {"ca_file": str(tls.ca)}}
            with run_proxy(f"127.0.0.1:{relay_port}", upstream=upstream) as proxy:
                topic = create_topic(proxy.bootstrap, unique_topic_name("tls"), 1, None)
                got = _produce_and_consume(proxy.bootstrap, topic, {})
                assert got == [b"secret-%d" % i for i in range(5)]
                assert proxy.nodes == {111: ("127.0.0.1", relay_port)}
            # Without the CA the proxy refuses the relay's certificate: the client gets nothing.
            with run_proxy(f"127.0.0.1:{relay_port}", upstream={"tls": {}}) as proxy:
                from confluent_kafka import Producer

                producer = Producer(
                    {"bootstrap.servers": proxy.bootstrap, "message.timeout.ms": 3000}
                )
                failures: list[object] = []
                producer.produce(topic, b"x", on_delivery=lambda err, _: failures.append(err))
                producer.flush(10)
                assert len(failures) == 1
                assert failures[0] is not None
