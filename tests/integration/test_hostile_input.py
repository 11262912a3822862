"""Hostile Produce requests against a proxy in front of Tansu: what decoding may hold is bounded
per request and per process, what costs too much to check on the event loop is checked off it,
and every such request is answered (MESSAGE_TOO_LARGE naming the limit), never a closed
connection, while a legitimate batch that expands far is still accepted."""

from __future__ import annotations

import struct
import textwrap
import threading
import uuid
import zlib
from pathlib import Path
from typing import Any

import cramjam
import pytest

from kvproxy.protocol.compression import Codec
from kvproxy.protocol.records import build_batch
from tests.harness import Broker
from tests.harness.metrics import closed, scrape, value
from tests.harness.produce import produce, record_errors, stored
from tests.harness.proxy import proxy_config, run_proxy
from tests.harness.proxy_checks import assert_idle, assert_serves

MiB = 1024 * 1024
MESSAGE_TOO_LARGE = 10


def zeros_batch(records: int, value_bytes: int, codec: Codec = Codec.ZSTD, **options: Any) -> bytes:
    """A batch of `records` records whose values are `value_bytes` zero bytes: a few KiB of zstd
    that expand to records * value_bytes."""
    value = bytes(value_bytes)
    return build_batch([(b"k", value, None, None) for _ in range(records)], codec=codec, **options)


# ---- the per-request and per-process budgets ----


def test_a_partition_past_the_request_budget_is_answered_and_the_others_pass(
    tansu: Broker, make_topic: Any
) -> None:
    topic = make_topic(2)
    config = proxy_config(tansu.bootstrap, limits={"decode_bytes_per_request": 8 * MiB})
    bomb = zeros_batch(20, MiB)  # 20 MiB once decompressed
    assert len(bomb) < 64 * 1024
    with run_proxy(config=config) as proxy:
        answers = produce(
            proxy.host, proxy.port, 9, [(topic, 0, bomb), (topic, 1, zeros_batch(3, 1000))]
        )
        refused = answers[(topic, 0)]
        assert refused.error_code == MESSAGE_TOO_LARGE
        assert "limits.decode_bytes_per_request" in (refused.error_message or "")
        assert str(8 * MiB) in (refused.error_message or "")
        assert answers[(topic, 1)].error_code == 0
        scraped = scrape(proxy)
        assert value(scraped, "kvproxy_decode_budget_refusals_total") == 1
        assert value(scraped, "kvproxy_decode_memory_bytes") == 0  # all given back
        assert proxy.server.decode_memory.in_use == 0
        assert proxy.server.decode_memory.peak <= 8 * MiB
        assert_serves(proxy)
    assert stored(tansu, topic, 0) == []
    assert stored(tansu, topic, 1) == [bytes(1000)] * 3


def test_the_process_budget_bounds_a_request_the_request_budget_allows(
    tansu: Broker, topic: str
) -> None:
    config = proxy_config(
        tansu.bootstrap,
        limits={"decode_bytes_per_request": 64 * MiB, "decode_memory_bytes": 16 * MiB},
    )
    with run_proxy(config=config) as proxy:
        answers = produce(proxy.host, proxy.port, 9, [(topic, 0, zeros_batch(20, MiB))])
        refused = answers[(topic, 0)]
        assert refused.error_code == 19  # NOT_ENOUGH_REPLICAS: retried, the budget frees
        assert "limits.decode_memory_bytes" in (refused.error_message or "")
        assert proxy.server.decode_memory.peak <= 16 * MiB
        assert proxy.server.decode_memory.in_use == 0
    assert stored(tansu, topic) == []


def test_many_partitions_each_under_the_budget_are_checked_one_at_a_time(
    tansu: Broker, make_topic: Any
) -> None:
    """Twenty partitions of 6 MiB each: 120 MiB in all, but each partition's memory goes back
    before the next is decoded, so a 16 MiB budget checks and accepts them all (each partition
    holds its 6 MiB and the zstd decoder's window, up to 6 MiB more, while it is decoded)."""
    topic = make_topic(20)
    config = proxy_config(tansu.bootstrap, limits={"decode_bytes_per_request": 16 * MiB})
    part = zeros_batch(6, MiB)
    with run_proxy(config=config) as proxy:
        answers = produce(proxy.host, proxy.port, 9, [(topic, n, part) for n in range(20)])
        assert {a.error_code for a in answers.values()} == {0}
        assert 6 * MiB <= proxy.server.decode_memory.peak <= 16 * MiB
    assert len(stored(tansu, topic, 19)) == 6


def test_a_legitimate_batch_that_expands_far_is_accepted(tansu: Broker, topic: str) -> None:
    """60,000 records of 1 KiB of zeros: 60 KiB of zstd for 60 MiB of records, as a producer with
    a large batch.size writes it; a broker accepts it, and so does the proxy (off the loop)."""
    batch = zeros_batch(60_000, 1024)
    assert len(batch) < 256 * 1024
    with run_proxy(tansu.bootstrap) as proxy:
        answers = produce(proxy.host, proxy.port, 9, [(topic, 0, batch)])
        assert answers[(topic, 0)].error_code == 0
        assert value(scrape(proxy), "kvproxy_produce_off_loop_total") == 1
        assert proxy.server.decode_memory.in_use == 0
    values = stored(tansu, topic)
    assert len(values) == 60_000
    assert set(values) == {bytes(1024)}


def test_acks_0_past_the_budget_closes_the_connection(tansu: Broker, topic: str) -> None:
    """acks=0 expects no answer: as for every rejection, the proxy closes, as a broker does."""
    from tests.harness.produce import produce_frame
    from tests.harness.raw_client import RawKafkaClient

    config = proxy_config(tansu.bootstrap, limits={"decode_bytes_per_request": 8 * MiB})
    with run_proxy(config=config) as proxy:
        with RawKafkaClient(proxy.host, proxy.port) as client:
            client.send_frame(produce_frame(9, 1, [(topic, 0, zeros_batch(20, MiB))], acks=0))
            assert client.is_closed_by_peer(timeout=10)
        assert closed(proxy, "acks0_rejection") == 1
        assert_serves(proxy)
    assert stored(tansu, topic) == []


# ---- off the event loop ----

GATED = '''
import threading

released = threading.Event()
started = threading.Event()
threads = []


class Gate:
    """Decodes every record, then waits until the test says the other client was answered."""

    name = "gate"

    @classmethod
    def create(cls, context, options):
        return cls()

    def validate(self, topic, partition, produced):
        from kvproxy.policies.api import ACCEPT
        produced.record_tuple()
        threads.append(threading.current_thread().name)
        started.set()
        if not released.wait(60):
            raise RuntimeError("never released")
        return ACCEPT

    def close(self):
        pass
'''


@pytest.fixture
def gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Any]:
    """(class path, module) of a policy that blocks until the test releases it."""
    import importlib

    module = f"gate_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(GATED))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{module}:Gate", importlib.import_module(module)


def test_a_costly_request_is_checked_off_the_loop_while_others_are_answered(
    tansu: Broker, make_topic: Any, gate: tuple[str, Any]
) -> None:
    """The gate policy holds the costly request's check until another client has been answered
    through the same proxy: were the check on the event loop, that answer could never come and
    the test would time out. Small requests to the gated topic are still decided on the loop."""
    class_path, module = gate
    gated, other = make_topic(), make_topic()
    config = proxy_config(
        tansu.bootstrap,
        topics=[
            {
                "match": gated,
                "default_policies": "drop",
                "policies": [{"custom": {"class": class_path}}],
            }
        ],
    )
    with run_proxy(config=config) as proxy:
        results: dict[str, Any] = {}

        def costly() -> None:
            results["costly"] = produce(
                proxy.host, proxy.port, 9, [(gated, 0, zeros_batch(40, MiB))]
            )

        sender = threading.Thread(target=costly)
        sender.start()
        try:
            assert module.started.wait(30), "the costly request was never checked"
            for n in range(5):  # answered while the costly check is still held
                answer = produce(proxy.host, proxy.port, 9, [(other, 0, zeros_batch(1, 10))])
                assert answer[(other, 0)].error_code == 0, n
            assert "costly" not in results
        finally:
            module.released.set()
            sender.join(60)
        assert results["costly"][(gated, 0)].error_code == 0
        assert module.threads[0].startswith("kvproxy-decode")
        scraped = scrape(proxy)
        assert value(scraped, "kvproxy_produce_off_loop_total") == 1
        assert value(scraped, "kvproxy_event_loop_lag_seconds_count") >= 1
        assert value(scraped, "kvproxy_event_loop_lag_max_seconds") >= 0
        # a small request to the same topic is decided on the loop, not the decoding thread
        module.threads.clear()
        small = produce(proxy.host, proxy.port, 9, [(gated, 0, zeros_batch(2, 10))])
        assert small[(gated, 0)].error_code == 0
        assert len(module.threads) == 1
        assert not module.threads[0].startswith("kvproxy-decode")
        assert value(scrape(proxy), "kvproxy_produce_off_loop_total") == 1
        assert_idle(proxy)
    assert len(stored(tansu, gated)) == 42


def test_later_requests_on_the_connection_are_answered_in_order_after_an_off_loop_one(
    tansu: Broker, make_topic: Any
) -> None:
    """A request decided off the loop holds the connection's later requests: answers leave in
    request order."""
    from kvproxy.protocol.messages import PRODUCE, decode_response
    from tests.harness.produce import produce_frame
    from tests.harness.raw_client import RawKafkaClient

    topic = make_topic()
    with run_proxy(tansu.bootstrap) as proxy:
        with RawKafkaClient(proxy.host, proxy.port) as client:
            client.send_frame(produce_frame(9, 1, [(topic, 0, zeros_batch(20_000, 10))]))
            for n in range(2, 6):
                client.send_frame(produce_frame(9, n, [(topic, 0, zeros_batch(1, 10))]))
            ids = []
            for _ in range(5):
                answer = client.recv_frame(timeout=30)
                ids.append(struct.unpack_from(">i", answer)[0])
                body = decode_response(answer, PRODUCE, 9).body
                assert body.responses[0].partition_responses[0].error_code == 0
        assert ids == [1, 2, 3, 4, 5]
        assert value(scrape(proxy), "kvproxy_produce_off_loop_total") == 1
    assert len(stored(tansu, topic)) == 20_004


# ---- answers that stay bounded ----


def test_a_legacy_wrapper_of_two_million_messages_is_answered(tansu: Broker, topic: str) -> None:
    """A magic 1 gzip wrapper (Produce v2) holding 2,000,000 inner messages: MESSAGE_TOO_LARGE
    naming max_records_per_request, counted from the inner length fields, not a closed
    connection."""
    body = struct.pack(">bbq", 1, 0, 1_700_000_000_000) + struct.pack(">ii", -1, 1) + b"v"
    inner = struct.pack(">qiI", 0, 4 + len(body), zlib.crc32(body)) + body
    payload = bytes(cramjam.gzip.compress(inner * 2_000_000))
    wrapper_body = struct.pack(">bbq", 1, int(Codec.GZIP), 1_700_000_000_000)
    wrapper_body += struct.pack(">i", -1) + struct.pack(">i", len(payload)) + payload
    wrapper = struct.pack(">qiI", 1_999_999, 4 + len(wrapper_body), zlib.crc32(wrapper_body))
    wrapper += wrapper_body
    with run_proxy(tansu.bootstrap) as proxy:
        answers = produce(proxy.host, proxy.port, 2, [(topic, 0, wrapper)])
        answer = answers[(topic, 0)]
        assert answer.error_code == MESSAGE_TOO_LARGE  # v2 answers carry no message: the log
        assert proxy.server.sink.rejections == {(topic, "max_records_per_request", 10): 1}
        assert_serves(proxy)
    assert stored(tansu, topic) == []


def test_record_errors_in_an_answer_are_capped(tansu: Broker, topic: str) -> None:
    """5,000 records without a key on a compacted topic: the answer lists the first 1,000 record
    errors and its message counts all 5,000."""
    config = proxy_config(tansu.bootstrap, topics=[{"match": topic, "compacted": True}])
    batch = build_batch([(None, b"v", None, None) for _ in range(5_000)], codec=Codec.ZSTD)
    with run_proxy(config=config) as proxy:
        answer = produce(proxy.host, proxy.port, 9, [(topic, 0, batch)])[(topic, 0)]
        assert answer.error_code == 87  # INVALID_RECORD
        errors = record_errors(answer)
        assert len(errors) == 1_000
        assert [index for index, _ in errors] == list(range(1_000))
        assert "due to 5000 record errors in total" in (answer.error_message or "")
    assert stored(tansu, topic) == []


# ---- receive memory ----


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096


def test_size_prefixes_alone_reserve_receive_memory_not_allocate_it(tansu: Broker) -> None:
    """300 connections each send only the 4-byte prefix of a 50 MiB request: ten of them fit the
    512 MiB of receive memory and start buffers of 64 KiB; the others wait, unread. Nobody's
    memory grows beyond what arrived, and a small request on another connection is answered."""
    import socket

    with run_proxy(tansu.bootstrap) as proxy:
        assert_serves(proxy)
        before = _rss()
        socks = []
        try:
            for _ in range(300):
                sock = socket.create_connection((proxy.host, proxy.port))
                sock.sendall(struct.pack(">i", 50 * MiB))
                socks.append(sock)
            wait_until_true(lambda: proxy.server.receive_memory.in_use == 10 * 50 * MiB)
            wait_until_true(
                lambda: value(scrape(proxy), "kvproxy_receive_memory_waits_total") == 290
            )
            assert _rss() - before < 100 * MiB
            assert_serves(proxy)  # requests below 64 KiB need no reservation
        finally:
            for sock in socks:
                sock.close()
        wait_until_true(lambda: proxy.server.receive_memory.in_use == 0)
        assert_idle(proxy)


def test_a_request_waiting_for_receive_memory_is_read_when_memory_frees(
    tansu: Broker, topic: str
) -> None:
    """Receive memory for one 1 MiB request: a client that started one and stalls holds it, so
    a second client's large request waits unread (a warning says why) until the first is
    closed for stalling; then it is read, checked, forwarded and answered."""
    from tests.harness.produce import produce_frame
    from tests.harness.raw_client import RawKafkaClient

    config = proxy_config(
        tansu.bootstrap,
        limits={
            "max_frame_bytes": MiB,
            "receive_buffer_bytes": MiB,
            "request_timeout_ms": 1500,
        },
    )
    request = produce_frame(9, 5, [(topic, 0, build_batch([(b"k", bytes(700_000), None, None)]))])
    with run_proxy(config=config) as proxy:
        with RawKafkaClient(proxy.host, proxy.port) as staller:
            staller.send_raw(struct.pack(">i", MiB - 10) + b"x" * 1000)
            wait_until_true(lambda: proxy.server.receive_memory.in_use == MiB - 10)
            with RawKafkaClient(proxy.host, proxy.port) as waiter:
                waiter.send_frame(request)
                answer = waiter.recv_frame(timeout=30)  # after the staller is dropped
                assert struct.unpack_from(">i", answer)[0] == 5
            assert staller.is_closed_by_peer(timeout=1)
        assert closed(proxy, "slow_request") == 1
        assert value(scrape(proxy), "kvproxy_receive_memory_waits_total") >= 1
        wait_until_true(lambda: proxy.server.receive_memory.in_use == 0)
    assert stored(tansu, topic) == [bytes(700_000)]


def wait_until_true(condition: Any, timeout: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.02)


def test_bad_timestamps_are_answered_without_decoding_every_record(
    tansu: Broker, topic: str
) -> None:
    """300,000 records with timestamps ten days ahead under a 16 MiB budget: building a `Record` for
    each would need about 70 MiB, so the answer comes from the reader's timestamps alone:
    INVALID_TIMESTAMP with the first 1,000 record errors, as the broker words them."""
    import time

    from kvproxy.protocol.messages import PRODUCE, decode_response
    from tests.harness.produce import partitions_of, produce_frame
    from tests.harness.raw_client import RawKafkaClient

    future = int(time.time() * 1000) + 10 * 24 * 3600 * 1000  # past the hour allowed ahead
    batch = build_batch([(b"k", None, None, future + n) for n in range(300_000)], codec=Codec.ZSTD)
    config = proxy_config(tansu.bootstrap, limits={"decode_bytes_per_request": 16 * MiB})
    with run_proxy(config=config) as proxy:
        with RawKafkaClient(proxy.host, proxy.port) as client:
            raw = client.request(produce_frame(9, 3, [(topic, 0, batch)]), timeout=30)
        answer = partitions_of(decode_response(raw, PRODUCE, 9).body)[(topic, 0)]
        assert answer.error_code == 32, answer.error_message  # INVALID_TIMESTAMP
        assert answer.error_message == (
            "One or more records have been rejected due to invalid timestamp"
        )
        errors = record_errors(answer)
        assert len(errors) == 1_000
        assert errors[5][0] == 5
        assert (errors[5][1] or "").startswith(f"Timestamp {future + 5} of message with offset 5 ")
        assert len(raw) < 200 * 1024
        assert proxy.server.decode_memory.peak <= 16 * MiB
    assert stored(tansu, topic) == []


def test_a_legacy_wrapper_past_the_budget_is_answered_and_the_connection_kept(
    tansu: Broker, topic: str
) -> None:
    """A magic 1 gzip wrapper (Produce v2) expanding to 12 MiB under an 8 MiB budget: its inner
    messages cannot be counted, its check cannot run: MESSAGE_TOO_LARGE, on a connection that
    then serves the next request (counting it for the metrics decodes nothing)."""
    from kvproxy.protocol.messages import PRODUCE, decode_response
    from tests.harness.produce import partitions_of, produce_frame
    from tests.harness.raw_client import RawKafkaClient

    wrapper = build_batch(
        [(None, bytes(MiB), None, None) for _ in range(12)], magic=1, codec=Codec.GZIP
    )
    config = proxy_config(tansu.bootstrap, limits={"decode_bytes_per_request": 8 * MiB})
    with run_proxy(config=config) as proxy:
        with RawKafkaClient(proxy.host, proxy.port) as client:
            raw = client.request(produce_frame(2, 1, [(topic, 0, wrapper)]), timeout=30)
            answer = partitions_of(decode_response(raw, PRODUCE, 2).body)[(topic, 0)]
            assert answer.error_code == MESSAGE_TOO_LARGE
            raw = client.request(produce_frame(2, 2, [(topic, 0, zeros_batch(1, 5))]), timeout=30)
            assert partitions_of(decode_response(raw, PRODUCE, 2).body)[(topic, 0)].error_code == 0
        assert proxy.server.sink.rejections == {(topic, "decode_budget", 10): 1}
    assert stored(tansu, topic) == [bytes(5)]
