"""A client that holds receive memory by sending its request a byte at a time: progress is the
time to complete a frame, not the time since the last byte, so the memory comes back within
`limits.frame_receive_timeout_ms` and the request that waited for it is answered."""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from kvproxy.protocol.records import build_batch
from tests.harness import Broker
from tests.harness.metrics import closed, scrape, value
from tests.harness.produce import produce_frame, stored
from tests.harness.proxy import proxy_config, run_proxy
from tests.harness.raw_client import RawKafkaClient

MiB = 1024 * 1024
TRICKLE_INTERVAL_S = 0.2


def wait_until_true(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.02)


@contextmanager
def trickling(client: RawKafkaClient, stop: threading.Event) -> Iterator[list[int]]:
    """Send one byte per `TRICKLE_INTERVAL_S` until `stop` is set or the proxy closes; yields
    the count of bytes sent (a byte always arrives well within `limits.request_timeout_ms`)."""
    sent = [0]

    def run() -> None:
        while not stop.wait(TRICKLE_INTERVAL_S):
            try:
                client.send_raw(b"x")
            except OSError:
                return
            sent[0] += 1

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield sent
    finally:
        stop.set()
        thread.join(timeout=5)


def test_a_frame_trickled_a_byte_at_a_time_loses_its_receive_memory_at_its_deadline(
    tansu: Broker, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Receive memory for one 1 MiB request. Client A declares a request of that size and sends
    one byte every 200 ms: never quiet for `request_timeout_ms`, never done. Client B's 100 KiB
    request waits for the memory, and is read, forwarded and answered once A's frame is past
    `frame_receive_timeout_ms`; A's connection is closed (A sees the close), the close is counted
    under `frame_receive_timeout`, and a warning names the setting."""
    config = proxy_config(
        tansu.bootstrap,
        limits={
            "max_frame_bytes": MiB,
            "receive_buffer_bytes": MiB,
            "request_timeout_ms": 30_000,
            "frame_receive_timeout_ms": 500,
        },
    )
    value_100k = bytes(100 * 1024)
    request = produce_frame(9, 7, [(topic, 0, build_batch([(b"k", value_100k, None, None)]))])
    assert len(request) > 64 * 1024  # a large frame: it must reserve receive memory
    stop = threading.Event()
    with caplog.at_level(logging.WARNING, logger="kvproxy"), run_proxy(config=config) as proxy:
        with RawKafkaClient(proxy.host, proxy.port) as slow:
            slow.send_raw(struct.pack(">i", MiB) + b"x" * 100)
            wait_until_true(lambda: proxy.server.receive_memory.in_use == MiB)
            with trickling(slow, stop) as sent, RawKafkaClient(proxy.host, proxy.port) as waiter:
                waiter.send_frame(request)
                answer = waiter.recv_frame(timeout=30)  # once A's frame is past its deadline
                assert struct.unpack_from(">i", answer)[0] == 7
                assert sent[0] >= 1  # A kept sending: not a stall
                assert slow.is_closed_by_peer(timeout=5)
        assert closed(proxy, "frame_receive_timeout") == 1
        assert closed(proxy, "slow_request") == 0
        assert value(scrape(proxy), "kvproxy_receive_memory_waits_total") >= 1
        wait_until_true(lambda: proxy.server.receive_memory.in_use == 0)
    warnings = [
        r.getMessage() for r in caplog.records if "frame_receive_timeout_ms" in r.getMessage()
    ]
    assert len(warnings) == 1, warnings
    assert "500 ms" in warnings[0]
    assert stored(tansu, topic) == [value_100k]


def test_a_request_waiting_for_receive_memory_is_not_overtaken_by_later_ones(
    tansu: Broker, make_topic: Callable[[int], str]
) -> None:
    """Receive memory for one 1 MiB request; client A holds 600 KiB of it with a request it
    does not finish. Client B's 900 KiB request waits for memory. Client C's 200 KiB request
    would fit in what is left, but waits behind B (or requests that each fit could keep B out for
    ever). Once A is gone, B and then C are read, forwarded and answered."""
    topic = make_topic(2)
    config = proxy_config(
        tansu.bootstrap, limits={"max_frame_bytes": MiB, "receive_buffer_bytes": MiB}
    )
    big, small = bytes(900 * 1024), bytes(200 * 1024)
    big_request = produce_frame(9, 8, [(topic, 0, build_batch([(b"k", big, None, None)]))])
    small_request = produce_frame(9, 9, [(topic, 1, build_batch([(b"k", small, None, None)]))])

    def waits() -> float:
        return value(scrape(proxy), "kvproxy_receive_memory_waits_total")

    with run_proxy(config=config) as proxy:
        with (
            RawKafkaClient(proxy.host, proxy.port) as holder,
            RawKafkaClient(proxy.host, proxy.port) as first,
            RawKafkaClient(proxy.host, proxy.port) as later,
        ):
            holder.send_raw(struct.pack(">i", 600 * 1024) + b"x" * 100)
            wait_until_true(lambda: proxy.server.receive_memory.in_use == 600 * 1024)
            first.send_frame(big_request)
            wait_until_true(lambda: waits() == 1)
            later.send_frame(small_request)
            wait_until_true(lambda: waits() == 2, timeout=10)  # C queues behind B
            assert value(scrape(proxy), "kvproxy_receive_memory_bytes") == 600 * 1024
            holder.close()
            assert struct.unpack_from(">i", first.recv_frame(timeout=30))[0] == 8
            assert struct.unpack_from(">i", later.recv_frame(timeout=30))[0] == 9
        wait_until_true(lambda: proxy.server.receive_memory.in_use == 0)
    assert stored(tansu, topic, 0) == [big]
    assert stored(tansu, topic, 1) == [small]


def test_a_frame_behind_a_long_poll_keeps_its_receive_memory_no_longer(
    tansu: Broker, topic: str
) -> None:
    """With one request in flight allowed per connection, client A sends a Fetch that waits up
    to a minute for data that never comes and, in the same write, the start of a 1 MiB request.
    The proxy stops reading A until the Fetch is answered, which is A's own doing: the frame's
    clock runs on, so A is closed at `frame_receive_timeout_ms` and client B's 100 KiB request,
    waiting for the memory, is answered without waiting for A's long poll."""
    from tests.harness.requests import fetch_request, topic_id_of

    config = proxy_config(
        tansu.bootstrap,
        limits={
            "max_frame_bytes": MiB,
            "receive_buffer_bytes": MiB,
            "max_in_flight_requests": 1,
            "frame_receive_timeout_ms": 500,
        },
    )
    value_100k = bytes(100 * 1024)
    request = produce_frame(9, 7, [(topic, 0, build_batch([(b"k", value_100k, None, None)]))])
    with run_proxy(config=config) as proxy:
        with RawKafkaClient(proxy.host, proxy.port) as slow:
            fetch = fetch_request(
                13, 1, topic_id_of(slow, topic), max_wait_ms=60_000, min_bytes=MiB
            )
            slow.send_raw(
                struct.pack(">i", len(fetch)) + fetch + struct.pack(">i", MiB) + b"x" * 100
            )
            wait_until_true(lambda: proxy.server.receive_memory.in_use == MiB)
            with RawKafkaClient(proxy.host, proxy.port) as waiter:
                waiter.send_frame(request)
                answer = waiter.recv_frame(timeout=30)  # before the Fetch's minute is up
                assert struct.unpack_from(">i", answer)[0] == 7
            assert slow.is_closed_by_peer(timeout=5)
        assert closed(proxy, "frame_receive_timeout") == 1
    assert stored(tansu, topic) == [value_100k]
