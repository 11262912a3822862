"""Edges of the error semantics through kvproxy (raw Produce requests; Tansu and Apache Kafka
upstream): the `kip` profile for other rejections, timestamps per version, the v0-v2 column,
malformed batches in every mode, empty partitions, undecodable request bodies."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.harness.produce import JSON_ONLY, batch, produce, produce_frame, record_errors, stored
from tests.harness.proxy import run_proxy
from tests.harness.raw_client import RawClientError, RawKafkaClient
from tests.harness.upstream import Upstream

INVALID_RECORD = 87
INVALID_TIMESTAMP = 32

pytestmark = pytest.mark.upstreams("tansu", "kafka")


def test_kip_profile_answers_85_for_other_record_rejections(
    upstream: Upstream, make_topic: Any
) -> None:
    topic = make_topic(2)
    with run_proxy(upstream.bootstrap, defaults=JSON_ONLY, errors={"profile": "kip"}) as proxy:
        answers = produce(
            proxy.host, proxy.port, 9, [(topic, 0, batch(b"nope")), (topic, 1, batch(b"[]"))]
        )
    assert answers[(topic, 0)].error_code == 85, answers[(topic, 0)]
    assert [i for i, _ in record_errors(answers[(topic, 0)])] == [0]
    assert answers[(topic, 1)].error_code == 0
    assert stored(upstream, topic, 0) == []


@pytest.mark.parametrize(("version", "code"), [(9, INVALID_TIMESTAMP), (5, 32), (2, 2)])
def test_timestamp_out_of_bounds_per_version(
    upstream: Upstream, make_topic: Any, version: int, code: int
) -> None:
    topic = make_topic(2)
    future = int(time.time() * 1000) + 2 * 3600 * 1000
    late = build_batch_with_timestamp(b"late", future)
    parts = [(topic, 0, late), (topic, 1, batch(b"now"))]
    with run_proxy(upstream.bootstrap) as proxy:  # default policies include timestamps
        if upstream.is_kafka and version <= 2:
            # Kafka 4 closes the connection on Produce v0-v2 (KIP-896; test_kafka_legacy.py)
            with pytest.raises(RawClientError):
                produce(proxy.host, proxy.port, version, parts)
            assert stored(upstream, topic, 0) == [] and stored(upstream, topic, 1) == []
            return
        answers = produce(proxy.host, proxy.port, version, parts)
    bad = answers[(topic, 0)]
    assert bad.error_code == code, bad
    if version >= 8:
        assert bad.error_message == (
            "One or more records have been rejected due to invalid timestamp"
        )
        ((index, message),) = record_errors(bad)
        assert index == 0
        assert message.startswith(f"Timestamp {future} of message with offset 0 is out of range.")
    assert answers[(topic, 1)].error_code == 0
    assert stored(upstream, topic, 0) == []
    assert stored(upstream, topic, 1) == [b"now"]


def build_batch_with_timestamp(value: bytes, timestamp: int) -> bytes:
    from kvproxy.protocol.records import build_batch

    return build_batch([(b"k", value, None, timestamp)])


def test_idempotent_batch_below_magic_2_keeps_43_on_produce_v2(
    upstream: Upstream, make_topic: Any
) -> None:
    """UNSUPPORTED_FOR_MESSAGE_FORMAT is the v0-v2 answer, not the legacy code (`errors` in
    docs/configuration.md)."""
    topic = make_topic(1)
    policies = {"policies": [{"message_format": {"topic_magic": 1}}]}
    raw = batch(b"idem", producer_id=4000, producer_epoch=0, base_sequence=0)
    with run_proxy(upstream.bootstrap, defaults=policies) as proxy:
        answers = produce(proxy.host, proxy.port, 2, [(topic, 0, raw)])
    assert answers[(topic, 0)].error_code == 43
    assert stored(upstream, topic) == []


@pytest.mark.parametrize("mode", ["enforce", "warn", "off"])
def test_truncated_batch_is_refused_in_every_mode(
    upstream: Upstream, make_topic: Any, mode: str
) -> None:
    """A batch cut short is never forwarded, whatever the topic's mode. On Produce v3+ it is
    answered as Kafka answers it: the broker's batch iterator stops quietly at an incomplete
    batch, finds none, and ProduceRequest.validateRecords refuses the partition with 87."""
    topic = make_topic(2)
    truncated = batch(b"this batch is cut short")[:-6]
    topics = [{"match": topic, "mode": mode}]
    bug = (
        "BUG (kvproxy/proxy/produce/engine.py ProduceEngine._check): for a mode-off topic it "
        "returns ACCEPT before parse_records, so the malformed batch is forwarded to the broker"
    )
    with run_proxy(upstream.bootstrap, topics=topics) as proxy:
        try:
            answers = produce(
                proxy.host, proxy.port, 9, [(topic, 0, truncated), (topic, 1, batch(b"fine"))]
            )
        except RawClientError as exc:
            raise AssertionError(
                f"mode {mode}: no answer, the connection was closed ({exc}); {bug} "
                "(Tansu drops the connection on it)"
            ) from exc
    assert answers[(topic, 0)].error_code == INVALID_RECORD, (
        f"mode {mode}: expected INVALID_RECORD, got {answers[(topic, 0)]!r}; {bug}"
    )
    assert answers[(topic, 0)].error_message == (
        "Produce requests with version 9 must have at least one record batch per partition"
    )
    assert answers[(topic, 1)].error_code == 0
    assert stored(upstream, topic, 1) == [b"fine"]


def test_partition_without_records_on_v3_plus_is_invalid_record(
    upstream: Upstream, make_topic: Any
) -> None:
    topic = make_topic(2)
    with run_proxy(upstream.bootstrap) as proxy:
        answers = produce(proxy.host, proxy.port, 9, [(topic, 0, None), (topic, 1, batch(b"x"))])
    assert answers[(topic, 0)].error_code == 87, answers[(topic, 0)]
    assert answers[(topic, 1)].error_code == 0
    assert stored(upstream, topic, 1) == [b"x"]


def test_undecodable_produce_body_closes_the_connection(
    upstream: Upstream, make_topic: Any
) -> None:
    topic = make_topic(1)
    frame = produce_frame(9, 5, [(topic, 0, batch(b"x"))])
    with run_proxy(upstream.bootstrap) as proxy:
        with RawKafkaClient(proxy.host, proxy.port) as client:
            client.send_frame(frame[:-12])  # the body ends inside the records
            assert client.is_closed_by_peer(timeout=3)
        answers = produce(proxy.host, proxy.port, 9, [(topic, 0, batch(b"y"))])
        assert answers[(topic, 0)].error_code == 0
    assert stored(upstream, topic) == [b"y"]


def test_acks0_request_then_client_close_is_still_written(
    upstream: Upstream, make_topic: Any
) -> None:
    """A fire-and-forget producer that sends one acks=0 request and exits at once: a broker
    stores it (checked straight against the broker below), so must the proxy's upstream."""
    direct, proxied = make_topic(1), make_topic(1)
    with run_proxy(upstream.bootstrap, defaults=JSON_ONLY) as proxy:
        for n in range(5):
            for topic, (host, port) in (
                (direct, (upstream.host, upstream.port)),
                (proxied, (proxy.host, proxy.port)),
            ):
                client = RawKafkaClient(host, port)
                client.send_frame(produce_frame(9, 1, [(topic, 0, batch(b"[%d]" % n))], acks=0))
                client.close()
        deadline = time.monotonic() + 3
        while (
            len(stored(upstream, proxied)) < 5 or len(stored(upstream, direct)) < 5
        ) and time.monotonic() < deadline:
            time.sleep(0.05)
    expected = [b"[%d]" % n for n in range(5)]
    # Five connections: the broker owes no order between them, only that each record is stored.
    assert sorted(stored(upstream, direct)) == expected
    assert sorted(stored(upstream, proxied)) == expected, (
        "acks=0 requests forwarded just before the client connection ends must still be written"
    )


def test_pipelined_requests_while_compaction_is_discovered_keep_their_order(
    upstream: Upstream, make_topic: Any
) -> None:
    """The first request makes the proxy ask DescribeConfigs; the ones behind it wait their turn."""
    import struct

    from kvproxy.protocol.messages import PRODUCE, decode_response
    from tests.harness.produce import partitions_of
    from tests.harness.requests import metadata_request

    topic = make_topic(1, config={"cleanup.policy": "compact"})
    frames = [
        produce_frame(9, 601, [(topic, 0, batch(b"a", key=None))]),
        produce_frame(9, 602, [(topic, 0, batch(b"b", key=b"k"))]),
        metadata_request(12, 603),
        produce_frame(9, 604, [(topic, 0, batch(b"c", key=None))]),
        produce_frame(9, 605, [(topic, 0, batch(b"d", key=b"k"))]),
    ]
    with (
        run_proxy(upstream.bootstrap) as proxy,
        RawKafkaClient(proxy.host, proxy.port) as client,
    ):
        client.send_raw(b"".join(struct.pack(">i", len(f)) + f for f in frames))
        answers = [client.recv_frame(timeout=10) for _ in frames]
    assert [struct.unpack_from(">i", a)[0] for a in answers] == [601, 602, 603, 604, 605]
    codes = [
        int(partitions_of(decode_response(answers[i], PRODUCE, 9).body)[(topic, 0)].error_code)
        for i in (0, 1, 3, 4)
    ]
    assert codes == [87, 0, 87, 0]
    assert stored(upstream, topic) == [b"b", b"d"]


@pytest.mark.parametrize("version", [3, 8, 10, 11, 12])
def test_partition_rejection_merges_with_the_broker_answer_in_every_version(
    upstream: Upstream, make_topic: Any, version: int
) -> None:
    topic, other = make_topic(2), make_topic(1)
    parts = [
        (topic, 0, batch(b"[0]")),
        (topic, 1, batch(b"bad")),
        (other, 0, batch(b"[2]")),
    ]
    with run_proxy(upstream.bootstrap, defaults=JSON_ONLY) as proxy:
        answers = produce(proxy.host, proxy.port, version, parts)
    assert list(answers) == [(topic, 0), (topic, 1), (other, 0)], "request order"
    assert [int(answers[k].error_code) for k in answers] == [0, 87, 0]
    assert int(answers[(topic, 1)].base_offset) == -1
    if version >= 8:
        assert [i for i, _ in record_errors(answers[(topic, 1)])] == [0]
        assert answers[(topic, 0)].error_message is None
    assert stored(upstream, topic, 0) == [b"[0]"]
    assert stored(upstream, topic, 1) == []
    assert stored(upstream, other) == [b"[2]"]
