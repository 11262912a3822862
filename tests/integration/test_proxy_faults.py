"""kvproxy when things go wrong: the broker dies, clients vanish or misbehave, a bootstrap server is
down, a client never reads. Each test checks what the client sees and that the proxy is left clean
(no connection, upstream or task left behind) and still serving."""

from __future__ import annotations

import socket
import struct
import time

import pytest

from kvproxy.protocol.messages import METADATA, PRODUCE, decode_response
from tests.harness import Broker, create_topic, run_tansu, unique_topic_name
from tests.harness.clients import produce_and_consume
from tests.harness.proxy import RunningProxy, proxy_config, run_proxy
from tests.harness.proxy_checks import assert_idle, assert_serves
from tests.harness.raw_client import RawKafkaClient
from tests.harness.requests import (
    api_versions_request,
    correlation_id_of,
    fetch_request,
    metadata_request,
    produce_request,
    topic_id_of,
)
from tests.harness.tansu import free_port

# ---- (a) the broker dies under a connected client, then comes back on the same port ----


def test_upstream_killed_mid_stream_then_restarted() -> None:
    with run_tansu() as broker, run_proxy(broker.broker.bootstrap) as proxy:
        topic = create_topic(broker.broker.bootstrap, unique_topic_name("before"))
        client = RawKafkaClient(proxy.host, proxy.port)
        try:
            topic_id = topic_id_of(client, topic)
            # a long poll is in flight when the broker goes away
            client.send_frame(fetch_request(16, 5, topic_id, max_wait_ms=5000, min_bytes=1 << 20))
            time.sleep(0.2)
            broker.stop()
            assert client.is_closed_by_peer(timeout=10), "the proxy kept a dead upstream's client"
        finally:
            client.close()
        assert_idle(proxy)
        assert proxy.stats().listeners >= 1  # the bootstrap listener stays open

        # while the broker is down, a client is accepted and then closed: nothing to relay to
        with RawKafkaClient(proxy.host, proxy.port) as orphan:
            orphan.send_frame(api_versions_request(0, 6))
            assert orphan.is_closed_by_peer(timeout=10)
        assert_idle(proxy)

        broker.restart()  # same port; memory storage starts empty
        fresh = create_topic(broker.broker.bootstrap, unique_topic_name("after"))
        assert produce_and_consume(proxy.bootstrap, fresh) == [f"v{n}".encode() for n in range(5)]
    # run_proxy's exit stopped the proxy


def test_confluent_producer_reports_errors_when_the_broker_is_gone() -> None:
    from confluent_kafka import Producer

    with run_tansu() as broker, run_proxy(broker.broker.bootstrap) as proxy:
        topic = create_topic(broker.broker.bootstrap, unique_topic_name())
        producer = Producer(
            {"bootstrap.servers": proxy.bootstrap, "message.timeout.ms": 3000, "linger.ms": 0}
        )
        results: list[object] = []
        producer.produce(topic, b"ok", partition=0, on_delivery=lambda e, m: results.append(e))
        assert producer.flush(10) == 0 and results == [None]
        broker.stop()
        producer.produce(topic, b"lost", partition=0, on_delivery=lambda e, m: results.append(e))
        producer.flush(10)
        assert len(results) == 2 and results[1] is not None  # a delivery error, not a hang
        del producer
        assert_idle(proxy)


# ---- (b) clients that close with requests in flight ----


def test_clients_vanishing_with_requests_in_flight_leave_nothing_behind(
    proxy: RunningProxy, topic: str
) -> None:
    burst = b"".join(
        struct.pack(">i", len(r)) + r
        for r in (
            produce_request(9, 1, topic, [(b"k", b"x" * 1000)]),
            metadata_request(12, 2),
            produce_request(3, 3, topic, [(b"k", b"y")]),
            metadata_request(1, 4),
            api_versions_request(9, 5),
            produce_request(9, 6, topic, [(b"k", b"z")], acks=0),
        )
    )
    for _ in range(50):
        sock = socket.create_connection((proxy.host, proxy.port))
        sock.sendall(burst)
        sock.close()
    assert_idle(proxy)
    assert_serves(proxy)
    assert_idle(proxy)


def test_client_reset_with_requests_in_flight(proxy: RunningProxy, topic: str) -> None:
    """An abortive close (RST) in the middle of a pipeline, against the broker listener too."""
    burst = b"".join(
        struct.pack(">i", len(r)) + r for r in (metadata_request(12, n) for n in range(10))
    )
    with RawKafkaClient(proxy.host, proxy.port) as client:  # opens the node 111 listener
        assert correlation_id_of(client.request(metadata_request(1, 1))) == 1
    for port in (proxy.port, proxy.broker_port(111)) * 10:
        sock = socket.create_connection((proxy.host, port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.sendall(burst)
        sock.close()
    assert_idle(proxy)


# ---- (c) frames the proxy must refuse ----


@pytest.mark.parametrize(
    "first_bytes",
    [
        struct.pack(">i", -1),
        struct.pack(">i", -(2**31)),
        struct.pack(">i", 64 * 1024 + 1),
        struct.pack(">i", 2**31 - 1),
    ],
    ids=["minus-one", "most-negative", "one-over-limit", "huge"],
)
def test_bad_frame_size_disconnects_the_client_only(tansu: Broker, first_bytes: bytes) -> None:
    config = proxy_config(tansu.bootstrap, limits={"max_frame_bytes": 64 * 1024})
    with run_proxy(config=config) as proxy:
        healthy = RawKafkaClient(proxy.host, proxy.port)
        try:
            assert correlation_id_of(healthy.request(metadata_request(1, 1))) == 1
            with RawKafkaClient(proxy.host, proxy.port) as bad:
                bad.send_raw(first_bytes + b"\x00" * 16)
                assert bad.is_closed_by_peer(timeout=5)
            # the other client and new clients are unaffected
            assert correlation_id_of(healthy.request(metadata_request(1, 2))) == 2
        finally:
            healthy.close()
        assert_serves(proxy)
        assert_idle(proxy)


def test_frame_of_exactly_the_limit_is_relayed(tansu: Broker) -> None:
    limit = 64 * 1024
    config = proxy_config(tansu.bootstrap, limits={"max_frame_bytes": limit})
    with run_proxy(config=config) as proxy:
        topic = create_topic(tansu.bootstrap, unique_topic_name())
        request = produce_request(9, 9, topic, [(b"k", b"")])
        request = produce_request(9, 9, topic, [(b"k", b"v" * (limit - len(request) - 8))])
        pad = limit - len(request)
        request = produce_request(9, 9, topic, [(b"k", b"v" * (limit - len(request) - 8 + pad))])
        assert len(request) <= limit
        with RawKafkaClient(proxy.host, proxy.port) as client:
            answer = decode_response(client.request(request), PRODUCE, 9).body
        assert answer.responses[0].partition_responses[0].error_code == 0


@pytest.mark.parametrize(
    "payload",
    [b"\x00\x03", struct.pack(">hhi", PRODUCE, 99, 1) + b"\x00\x00"],
    ids=["shorter-than-a-header", "produce-v99"],
)
def test_undecodable_request_disconnects_the_client_only(proxy: RunningProxy, payload: bytes):
    with RawKafkaClient(proxy.host, proxy.port) as bad:
        bad.send_frame(payload)
        assert bad.is_closed_by_peer(timeout=5)
    assert_serves(proxy)
    assert_idle(proxy)


# ---- (d) the first bootstrap server is down ----


def test_bootstrap_failover_to_the_second_server(tansu: Broker, topic: str) -> None:
    closed = f"127.0.0.1:{free_port()}"
    with run_proxy([closed, tansu.bootstrap]) as proxy:
        with RawKafkaClient(proxy.host, proxy.port) as client:
            answer = decode_response(client.request(metadata_request(12, 3)), METADATA, 12).body
        assert [(b.node_id, b.port) for b in answer.brokers] == [(111, proxy.broker_port(111))]
        assert produce_and_consume(proxy.bootstrap, topic) == [f"v{n}".encode() for n in range(5)]


def test_no_bootstrap_server_reachable_closes_the_client(tansu: Broker) -> None:
    with run_proxy([f"127.0.0.1:{free_port()}"]) as proxy:
        with RawKafkaClient(proxy.host, proxy.port) as client:
            client.send_frame(api_versions_request(0, 1))
            assert client.is_closed_by_peer(timeout=10)
        assert_idle(proxy)


# ---- backpressure: a client that never reads its answers ----


def _rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def test_a_client_that_never_reads_is_paused_not_buffered(tansu: Broker) -> None:
    """Fetch answers (1 MiB each) pile up unread, then 1 MiB Produce requests follow: the proxy
    stops reading the client, so the client's `send` blocks long before 200 MiB are accepted."""
    config = proxy_config(
        tansu.bootstrap,
        limits={"max_in_flight_requests": 4, "write_buffer_high_bytes": 256 * 1024},
    )
    topic = create_topic(tansu.bootstrap, unique_topic_name("bp"))
    chunk = b"p" * (256 * 1024 - 200)
    with run_proxy(config=config) as proxy:
        with RawKafkaClient(proxy.host, proxy.port) as client:
            for n in range(4):
                answer = client.request(produce_request(9, n, topic, [(b"k", chunk)]), timeout=10)
                assert (
                    decode_response(answer, PRODUCE, 9)
                    .body.responses[0]
                    .partition_responses[0]
                    .error_code
                    == 0
                )
            topic_id = topic_id_of(client, topic)

        rss_before = _rss_bytes()
        sock = socket.create_connection((proxy.host, proxy.port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        fetches = b"".join(
            struct.pack(">i", len(r)) + r
            # min_bytes makes the broker answer with the data, never an empty answer after
            # max_wait (a loaded machine once got small answers with max_wait_ms=100, nothing
            # piled up and the proxy rightly kept reading)
            for r in (
                fetch_request(16, 100 + n, topic_id, max_wait_ms=5000, min_bytes=512 * 1024)
                for n in range(64)
            )
        )
        produce = produce_request(9, 1000, topic, [(b"k", b"q" * (1024 * 1024))])
        produce_frame = struct.pack(">i", len(produce)) + produce
        sent = 0
        limit = 200 * 1024 * 1024
        deadline = time.monotonic() + 20
        blocked = False
        try:
            sock.settimeout(20)
            sock.sendall(fetches)
            sock.settimeout(1.0)
            while sent < limit and time.monotonic() < deadline:
                try:
                    sent += sock.send(produce_frame)
                except TimeoutError:
                    blocked = True
                    break
            assert blocked, f"send never blocked: {sent >> 20} MiB accepted"
            assert sent < 64 * 1024 * 1024, f"{sent >> 20} MiB accepted before send blocked"
            assert _rss_bytes() - rss_before < 100 * 1024 * 1024
            stats = proxy.stats()
            assert (stats.client_connections, stats.upstream_connections) == (1, 1)
        finally:
            sock.close()
        assert_idle(proxy)
        assert_serves(proxy)
