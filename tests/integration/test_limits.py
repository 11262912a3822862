"""kvproxy's limits as a client meets them: connections over a limit closed at once, idle and
stalled connections closed after their timeout (and busy or progressing ones left alone), and a
Produce request declaring too many records answered before any record is decoded."""

from __future__ import annotations

import logging
import struct
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from kvproxy.protocol.messages import METADATA, decode_response
from tests.harness import Broker
from tests.harness.metrics import closed
from tests.harness.produce import batch, produce, stored
from tests.harness.proxy import proxy_config, run_proxy
from tests.harness.proxy_checks import assert_idle, assert_serves
from tests.harness.raw_client import RawKafkaClient
from tests.harness.requests import (
    correlation_id_of,
    fetch_request,
    metadata_request,
    produce_request,
    topic_id_of,
)


def answers_metadata(client: RawKafkaClient, correlation_id: int) -> bool:
    answer = client.request(metadata_request(12, correlation_id))
    return decode_response(answer, METADATA, 12).header.correlation_id == correlation_id


# ---- connections per listener and per client address ----


def test_connection_over_the_listener_limit_is_closed_at_once(tansu: Broker) -> None:
    config = proxy_config(tansu.bootstrap, limits={"max_connections_per_listener": 3})
    with run_proxy(config=config) as proxy:
        clients = [RawKafkaClient(proxy.host, proxy.port) for _ in range(3)]
        try:
            for n, client in enumerate(clients):
                assert answers_metadata(client, n)
            started = time.monotonic()
            with RawKafkaClient(proxy.host, proxy.port) as refused:
                assert refused.is_closed_by_peer(timeout=5)
            assert time.monotonic() - started < 2.0  # at once, not after some timeout
            stats = proxy.stats()
            assert (stats.client_connections, stats.upstream_connections) == (3, 3)
            assert closed(proxy, "too_many_connections") == 1
            for n, client in enumerate(clients):  # the others keep working
                assert answers_metadata(client, 10 + n)
            # another listener has a count of its own
            with RawKafkaClient(proxy.host, proxy.broker_port(111)) as other:
                assert answers_metadata(other, 20)
        finally:
            clients.pop().close()
        assert_serves(proxy)  # a slot is free again
        for client in clients:
            client.close()
        assert_idle(proxy)


def test_client_address_limit_counts_every_listener(tansu: Broker) -> None:
    config = proxy_config(tansu.bootstrap, limits={"max_connections_per_client": 2})
    with run_proxy(config=config) as proxy:
        with RawKafkaClient(proxy.host, proxy.port) as first:
            assert answers_metadata(first, 1)  # opens the node 111 listener
            with RawKafkaClient(proxy.host, proxy.broker_port(111)) as second:
                assert answers_metadata(second, 2)
                for port in (proxy.port, proxy.broker_port(111)):
                    with RawKafkaClient(proxy.host, port) as third:  # all share 127.0.0.1
                        assert third.is_closed_by_peer(timeout=5)
                assert answers_metadata(first, 3) and answers_metadata(second, 4)
                assert proxy.stats().upstream_connections == 2
        assert closed(proxy, "too_many_connections") == 2
        assert_serves(proxy)
        assert_idle(proxy)


def test_a_flood_of_refused_connections_is_logged_in_a_line_or_two(
    tansu: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    config = proxy_config(tansu.bootstrap, limits={"max_connections_per_client": 1})
    with caplog.at_level(logging.WARNING, logger="kvproxy"), run_proxy(config=config) as proxy:
        with RawKafkaClient(proxy.host, proxy.port) as holder:
            assert answers_metadata(holder, 1)
            for _ in range(50):
                with RawKafkaClient(proxy.host, proxy.port) as refused:
                    assert refused.is_closed_by_peer(timeout=5)
            assert answers_metadata(holder, 2)
        assert closed(proxy, "too_many_connections") == 50
    lines = [r.getMessage() for r in caplog.records if "refus" in r.getMessage()]
    assert 1 <= len(lines) <= 2, lines
    assert "127.0.0.1" in lines[0] and "limit 1" in lines[0]


# ---- idle connections ----


def test_idle_connection_is_closed_and_a_busy_one_is_not(tansu: Broker) -> None:
    config = proxy_config(tansu.bootstrap, limits={"idle_timeout_ms": 500})
    with run_proxy(config=config) as proxy:
        never_used = RawKafkaClient(proxy.host, proxy.port)
        idle = RawKafkaClient(proxy.host, proxy.port)
        busy = RawKafkaClient(proxy.host, proxy.port)
        try:
            assert answers_metadata(idle, 1)
            went_idle = time.monotonic()
            n = 0
            while time.monotonic() - went_idle < 2.0:  # a request every 50 ms: never idle
                n += 1
                assert answers_metadata(busy, 100 + n)
                time.sleep(0.05)
            assert idle.is_closed_by_peer(timeout=0.01), "the idle connection is still open"
            assert answers_metadata(busy, 1)
            # one that never sent anything is idle from the start
            assert never_used.is_closed_by_peer(timeout=0.01)
        finally:
            for client in (never_used, idle, busy):
                client.close()
        assert closed(proxy, "idle") == 2
        assert_idle(proxy)


def test_a_request_in_flight_is_not_idle(tansu: Broker, topic: str) -> None:
    """A long poll that takes longer than the idle timeout gets its answer."""
    config = proxy_config(tansu.bootstrap, limits={"idle_timeout_ms": 300})
    with run_proxy(config=config) as proxy, RawKafkaClient(proxy.host, proxy.port) as client:
        topic_id = topic_id_of(client, topic)
        started = time.monotonic()
        answer = client.request(
            fetch_request(16, 5, topic_id, max_wait_ms=1000, min_bytes=1 << 20), timeout=10
        )
        assert correlation_id_of(answer) == 5
        assert time.monotonic() - started >= 0.9  # the broker held it past the idle timeout
        assert answers_metadata(client, 6)  # and the connection is still there
        assert closed(proxy, "idle") == 0


# ---- a frame begun and never finished (slowloris) ----


def test_partial_frame_then_stall_is_dropped_after_the_request_timeout(tansu: Broker) -> None:
    config = proxy_config(
        tansu.bootstrap, limits={"request_timeout_ms": 300, "idle_timeout_ms": 60_000}
    )
    with run_proxy(config=config) as proxy:
        request = metadata_request(12, 1)
        frame = struct.pack(">i", len(request)) + request
        partials = [frame[:2], frame[:4], frame[: len(frame) // 2]]
        clients = [RawKafkaClient(proxy.host, proxy.port) for _ in partials]
        silent = RawKafkaClient(proxy.host, proxy.port)  # sent nothing: idle, not stalled
        try:
            started = time.monotonic()
            for client, partial in zip(clients, partials, strict=True):
                client.send_raw(partial)
            for client in clients:
                assert client.is_closed_by_peer(timeout=3)
            elapsed = time.monotonic() - started
            assert 0.3 <= elapsed < 3, elapsed
            assert not silent.is_closed_by_peer(timeout=0.3)
            assert answers_metadata(silent, 2)
        finally:
            for client in [*clients, silent]:
                client.close()
        assert closed(proxy, "slow_request") == 3
        assert closed(proxy, "idle") == 0
        assert_idle(proxy)


def test_slow_but_progressing_sender_is_not_dropped(tansu: Broker) -> None:
    config = proxy_config(tansu.bootstrap, limits={"request_timeout_ms": 600})
    with run_proxy(config=config) as proxy, RawKafkaClient(proxy.host, proxy.port) as client:
        request = metadata_request(12, 9)
        frame = struct.pack(">i", len(request)) + request
        started = time.monotonic()
        for offset in range(0, len(frame), 2):  # two bytes every 150 ms
            client.send_raw(frame[offset : offset + 2])
            time.sleep(0.15)
        assert time.monotonic() - started > 1.0  # far longer than the timeout in all
        answer = client.recv_frame()
        assert decode_response(answer, METADATA, 12).header.correlation_id == 9
        assert closed(proxy, "slow_request") == 0


# ---- records per Produce request ----

EXPLODING = '''
from kvproxy.policies.api import ACCEPT


class Exploding:
    """Decodes every record; raises on the first one."""

    name = "exploding"

    @classmethod
    def create(cls, context, options):
        return cls()

    def validate(self, topic, partition, batch):
        for record in batch.records():
            raise RuntimeError(f"decoded record {record.index}")
        return ACCEPT

    def close(self):
        pass
'''


@pytest.fixture
def exploding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The class path of a record-level policy that crashes whenever it is called."""
    module = f"exploding_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(EXPLODING))
    monkeypatch.chdir(tmp_path)
    return f"{module}:Exploding"


def test_too_many_records_are_refused_before_any_is_decoded(
    tansu: Broker, make_topic: Any, exploding: str
) -> None:
    guarded, plain = make_topic(2), make_topic()
    config = proxy_config(
        tansu.bootstrap,
        limits={"max_records_per_request": 10},
        topics=[
            {
                "match": guarded,
                "default_policies": "drop",
                "policies": [{"custom": {"class": exploding}}],
            }
        ],
    )
    with run_proxy(config=config) as proxy:
        values = [b"v%d" % n for n in range(11)]
        answers = produce(
            proxy.host,
            proxy.port,
            9,
            [(guarded, 0, batch(*values[:6])), (guarded, 1, batch(*values[6:]))],
        )
        for index in (0, 1):
            answer = answers[(guarded, index)]
            assert answer.error_code == 10, answer  # MESSAGE_TOO_LARGE
            assert "11 records" in (answer.error_message or "")
            assert "max_records_per_request" in (answer.error_message or "")
        assert proxy.server.routing.crash_counts() == {}  # the policy never ran
        assert proxy.server.sink.rejections == {
            (guarded, "max_records_per_request", 10): 2,
        }
        # exactly the limit passes
        ok = produce(proxy.host, proxy.port, 9, [(plain, 0, batch(*values[:10]))])
        assert ok[(plain, 0)].error_code == 0
        # an old client gets the same code, not the retriable legacy CORRUPT_MESSAGE
        legacy = produce(proxy.host, proxy.port, 2, [(plain, 0, batch(*values, magic=1))])
        assert legacy[(plain, 0)].error_code == 10
        assert_serves(proxy)
    assert stored(tansu, guarded, 0) == [] and stored(tansu, guarded, 1) == []
    assert stored(tansu, plain) == values[:10]


def test_too_many_records_with_acks_0_close_the_connection(tansu: Broker, topic: str) -> None:
    """acks=0 gets no answer, so the proxy closes the connection, as a broker does."""
    config = proxy_config(tansu.bootstrap, limits={"max_records_per_request": 10})
    with run_proxy(config=config) as proxy:
        with RawKafkaClient(proxy.host, proxy.port) as client:
            client.send_frame(
                produce_request(9, 1, topic, [(b"k", b"v%d" % n) for n in range(11)], acks=0)
            )
            assert client.is_closed_by_peer(timeout=5)
        assert closed(proxy, "acks0_rejection") == 1
        assert_serves(proxy)
    assert stored(tansu, topic) == []


def test_a_real_producer_sees_message_too_large(tansu: Broker, topic: str) -> None:
    from confluent_kafka import KafkaError, Producer

    config = proxy_config(tansu.bootstrap, limits={"max_records_per_request": 100})
    with run_proxy(config=config) as proxy:
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "linger.ms": 200})
        errors: list[Any] = []
        for n in range(300):
            producer.produce(
                topic, b"v%d" % n, partition=0, on_delivery=lambda e, m: errors.append(e)
            )
        assert producer.flush(15) == 0
        assert len(errors) == 300
        assert {e.code() if e else None for e in errors} == {KafkaError.MSG_SIZE_TOO_LARGE}
        del producer
    assert stored(tansu, topic) == []
