"""Half-open TLS handshakes (10 bytes of a ClientHello, then nothing) on the SNI listener: they
count against the connection limits from accept, handshakes in progress are bounded per address
and in total (those beyond closed at once), a handshake begun under pressure gets the short
timeout, and a client from another address still connects and produces (confluent-kafka)."""

from __future__ import annotations

import contextlib
import socket
import ssl
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer

from tests.harness import Broker
from tests.harness.metrics import closed
from tests.harness.produce import stored
from tests.harness.proxy import RunningProxy, proxy_config, run_proxy
from tests.harness.sni import BOOTSTRAP_NAME, BROKER_NAMES, CERTIFICATE_NAMES, SniEndpoint
from tests.harness.tls import TlsFiles, make_tls_files

HOSTILE = "127.0.0.2"


@pytest.fixture(scope="module")
def tls() -> Iterator[TlsFiles]:
    with make_tls_files(hostnames=CERTIFICATE_NAMES) as files:
        yield files


def client_hello_start() -> bytes:
    context = ssl.create_default_context()
    tls = context.wrap_bio(ssl.MemoryBIO(), outgoing := ssl.MemoryBIO(), server_hostname="x.y")
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()[:10]


@contextlib.contextmanager
def sni_proxy(broker: Broker, tls: TlsFiles, **limits: Any) -> Iterator[tuple[RunningProxy, int]]:
    server_tls = {"cert_file": str(tls.server_cert), "key_file": str(tls.server_key)}
    sni = {"port": 0, "bootstrap": BOOTSTRAP_NAME, "brokers": BROKER_NAMES, "tls": server_tls}
    config = proxy_config(broker.bootstrap, listen={"sni": sni}, limits=limits)
    with run_proxy(config=config) as proxy:

        async def port() -> int:
            return proxy.server.listeners.sni_port

        yield proxy, proxy.call(port())


def half_open(port: int, count: int, source: str = HOSTILE) -> list[socket.socket]:
    hello = client_hello_start()
    socks = []
    for _ in range(count):
        sock = socket.socket()
        sock.bind((source, 0))
        sock.settimeout(10)
        sock.connect(("127.0.0.1", port))
        sock.sendall(hello)
        socks.append(sock)
    return socks


def ended_by_the_proxy(sock: socket.socket, timeout: float = 10) -> bool:
    """The proxy closed it (EOF or reset) within `timeout`; False if it is still open."""
    sock.settimeout(timeout)
    try:
        return sock.recv(4096) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def still_open(sock: socket.socket) -> bool:
    return not ended_by_the_proxy(sock, timeout=0.05)


def innocent_produces(broker: Broker, port: int, tls: TlsFiles, topic: str) -> None:
    sni = SniEndpoint(port, tls.ca)
    producer = Producer({**sni.librdkafka(), "acks": "all", "message.timeout.ms": 30000})
    producer.produce(topic, b"innocent")
    assert producer.flush(45) == 0
    assert stored(broker, topic) == [b"innocent"]


def test_half_open_handshakes_over_the_address_limit_are_closed_at_once(
    tansu: Broker, topic: str, tls: TlsFiles
) -> None:
    with sni_proxy(tansu, tls, max_connections_per_client=5) as (proxy, port):
        socks = half_open(port, 12)
        try:
            assert [still_open(s) for s in socks[:5]] == [True] * 5
            assert [ended_by_the_proxy(s) for s in socks[5:]] == [True] * 7
            assert closed(proxy, "too_many_connections") == 7
            innocent_produces(tansu, port, tls, topic)  # another address: not held back
            assert all(still_open(s) for s in socks[:5])
        finally:
            for sock in socks:
                sock.close()


def test_handshakes_in_progress_are_bounded_per_address_and_in_total(
    tansu: Broker, topic: str, tls: TlsFiles
) -> None:
    with sni_proxy(tansu, tls, max_tls_handshakes=6, max_tls_handshakes_per_client=4) as (
        proxy,
        port,
    ):
        first = half_open(port, 6, "127.0.0.2")
        second = half_open(port, 4, "127.0.0.3")
        try:
            assert [still_open(s) for s in first[:4]] == [True] * 4
            assert [ended_by_the_proxy(s) for s in first[4:]] == [True] * 2  # per address
            assert [still_open(s) for s in second[:2]] == [True] * 2
            assert [ended_by_the_proxy(s) for s in second[2:]] == [True] * 2  # in total
            assert closed(proxy, "too_many_handshakes") == 4
        finally:
            for sock in first + second:
                sock.close()
        innocent_produces(tansu, port, tls, topic)


def test_a_handshake_begun_under_pressure_gets_the_short_timeout(
    tansu: Broker, tls: TlsFiles
) -> None:
    with sni_proxy(tansu, tls, max_tls_handshakes=4, tls_handshake_pressure_timeout_ms=200) as (
        _proxy,
        port,
    ):
        calm = half_open(port, 2, "127.0.0.2")  # half the bound: the usual 60 s timeout
        pressed = half_open(port, 1, "127.0.0.3")
        try:
            assert ended_by_the_proxy(pressed[0])
            assert all(still_open(s) for s in calm)
        finally:
            for sock in calm + pressed:
                sock.close()
