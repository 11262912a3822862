"""Produce answers of the validation engine, seen by a raw client, Tansu and Apache Kafka behind.
Each request is built with the project codec (`kvproxy.protocol.messages`, kio's request classes)
and
`kvproxy.protocol.records.build_batch`, sent through kvproxy, and the decoded answer is checked
field by
field (error_code, error_message, record_errors). What reached the broker is read back with a Fetch
sent straight to the broker, so "nothing stored" means the broker's log really is empty
(helpers: `tests/harness/produce.py`).
"""

from __future__ import annotations

import struct
import time
from typing import Any

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from kvproxy.protocol.messages import PRODUCE, decode_response
from tests.harness.produce import (
    ANOTHER_PARTITION,
    CORRUPT_MESSAGE,
    INVALID_RECORD,
    JSON_ONLY,
    Part,
    batch,
    compacted_message,
    kafka_message,
    partitions_of,
    produce,
    produce_frame,
    record_errors,
    stored,
)
from tests.harness.proxy import run_proxy
from tests.harness.raw_client import RawKafkaClient
from tests.harness.transactions import init_producer_id
from tests.harness.upstream import Upstream

pytestmark = pytest.mark.upstreams("tansu", "kafka")


# ---- corrupt batches: the proxy refuses what Tansu would store and Kafka refuses too ----


def test_flipped_byte_is_corrupt_message_through_the_proxy_and_on_kafka_stored_by_tansu(
    upstream: Upstream, make_topic: Any
) -> None:
    topic = make_topic(2)
    good = batch(b"good")
    corrupt = bytearray(batch(b"payload-with-a-flipped-byte"))
    assert corrupt[-2:] == b"e\x00"  # last value byte, then the header count
    corrupt[-2] ^= 0x01  # inside the value: the batch still parses, its CRC32C no longer matches
    corrupt = bytes(corrupt)

    with run_proxy(upstream.bootstrap) as proxy:
        answers = produce(proxy.host, proxy.port, 9, [(topic, 0, corrupt), (topic, 1, good)])
    bad, ok = answers[(topic, 0)], answers[(topic, 1)]
    assert bad.error_code == CORRUPT_MESSAGE, bad
    assert record_errors(bad) == []
    assert bad.error_message is None or "corrupt" in bad.error_message.lower(), bad
    assert ok.error_code == 0, ok
    assert stored(upstream, topic, 0) == []
    assert stored(upstream, topic, 1) == [b"good"]

    # The very same bytes straight to the broker: Kafka answers as the proxy did; Tansu does not
    # check the CRC and stores them.
    direct = produce(upstream.host, upstream.port, 9, [(topic, 0, corrupt)])[(topic, 0)]
    flipped = [b"payload-with-a-flipped-byt" + b"d"]
    expected = (CORRUPT_MESSAGE, []) if upstream.is_kafka else (0, flipped)
    assert (direct.error_code, stored(upstream, topic, 0)) == expected


# ---- null key on a compacted topic (compaction discovered with DescribeConfigs) ----


def test_null_key_on_compacted_topic_v9_has_kafka_message_and_record_errors(
    upstream: Upstream, make_topic: Any
) -> None:
    topic = make_topic(2, config={"cleanup.policy": "compact"})
    with run_proxy(upstream.bootstrap) as proxy:
        answers = produce(
            proxy.host,
            proxy.port,
            9,
            [(topic, 0, batch(b"no-key", key=None)), (topic, 1, batch(b"keyed", key=b"id-1"))],
        )
    bad, ok = answers[(topic, 0)], answers[(topic, 1)]
    expected = [(0, compacted_message(topic, 0))]
    assert bad.error_code == INVALID_RECORD, bad
    assert record_errors(bad) == expected
    assert bad.error_message == kafka_message(expected)
    assert ok.error_code == 0 and ok.error_message is None and record_errors(ok) == []
    assert stored(upstream, topic, 0) == []
    assert stored(upstream, topic, 1) == [b"keyed"]


def test_null_key_on_compacted_topic_v7_gets_the_code_alone(
    upstream: Upstream, make_topic: Any
) -> None:
    topic = make_topic(2, config={"cleanup.policy": "compact"})
    with run_proxy(upstream.bootstrap) as proxy:
        answers = produce(
            proxy.host,
            proxy.port,
            7,
            [(topic, 0, batch(b"no-key", key=None)), (topic, 1, batch(b"keyed", key=b"id-1"))],
        )
    bad, ok = answers[(topic, 0)], answers[(topic, 1)]
    assert bad.error_code == INVALID_RECORD, bad
    assert not hasattr(bad, "error_message") and not hasattr(bad, "record_errors")
    assert ok.error_code == 0
    assert stored(upstream, topic, 0) == []
    assert stored(upstream, topic, 1) == [b"keyed"]


def test_null_key_on_compacted_topic_kip_profile_answers_45(
    upstream: Upstream, make_topic: Any
) -> None:
    topic = make_topic(1, config={"cleanup.policy": "compact"})
    with run_proxy(upstream.bootstrap, errors={"profile": "kip"}) as proxy:
        answers = produce(proxy.host, proxy.port, 9, [(topic, 0, batch(b"v", key=None))])
    bad = answers[(topic, 0)]
    assert bad.error_code == 45, bad  # KIP-135's INVALID_RECORD_KEY
    assert record_errors(bad) == [(0, compacted_message(topic, 0))]
    assert stored(upstream, topic, 0) == []


def test_compacted_override_in_yaml_applies_to_a_non_compacted_topic(
    upstream: Upstream, make_topic: Any
) -> None:
    topic = make_topic(1)  # cleanup.policy=delete on the broker
    other = make_topic(1)
    with run_proxy(upstream.bootstrap, topics=[{"match": topic, "compacted": True}]) as proxy:
        answers = produce(
            proxy.host,
            proxy.port,
            9,
            [(topic, 0, batch(b"v", key=None)), (other, 0, batch(b"w", key=None))],
        )
    assert answers[(topic, 0)].error_code == INVALID_RECORD
    assert record_errors(answers[(topic, 0)]) == [(0, compacted_message(topic, 0))]
    assert answers[(other, 0)].error_code == 0  # not compacted: a null key is fine
    assert stored(upstream, topic) == []
    assert stored(upstream, other) == [b"w"]


# ---- record_errors: records 1 and 3 of 5 ----


def test_records_1_and_3_of_5_bad_give_their_indexes_and_messages(
    upstream: Upstream, make_topic: Any
) -> None:
    topic = make_topic(2)
    values = [b'{"n": 0}', b"not json", b'{"n": 2}', b"{broken", b'{"n": 4}']
    with run_proxy(upstream.bootstrap, defaults=JSON_ONLY) as proxy:
        answers = produce(
            proxy.host,
            proxy.port,
            9,
            [(topic, 0, batch(*values)), (topic, 1, batch(b'{"ok": true}'))],
        )
    bad = answers[(topic, 0)]
    tp = f"{topic}-0"
    expected = [
        (
            1,
            "Record value is not valid JSON (invalid literal, expected 'null': "
            "line 1 column 1) "
            f"in topic partition {tp}",
        ),
        (
            3,
            "Record value is not valid JSON (unexpected character, expected a string key: "
            f"line 1 column 2) in topic partition {tp}",
        ),
    ]
    assert bad.error_code == INVALID_RECORD, bad
    assert record_errors(bad) == expected
    assert bad.error_message == kafka_message(expected)
    assert bad.error_message.startswith(
        "One or more records have been rejected due to 2 record errors in total, "
    )
    assert answers[(topic, 1)].error_code == 0
    assert stored(upstream, topic, 0) == [], "no record of a rejected partition may be written"
    assert stored(upstream, topic, 1) == [b'{"ok": true}']


# ---- acks ----


def test_acks0_rejection_closes_the_connection_and_stores_nothing(
    upstream: Upstream, make_topic: Any
) -> None:
    topic = make_topic(1)
    with run_proxy(upstream.bootstrap, defaults=JSON_ONLY) as proxy:
        with RawKafkaClient(proxy.host, proxy.port) as client:
            client.send_frame(produce_frame(9, 11, [(topic, 0, batch(b"not json"))], acks=0))
            assert client.is_closed_by_peer(timeout=3), "acks=0 rejection must close the connection"
        # the proxy keeps serving other connections
        answers = produce(proxy.host, proxy.port, 9, [(topic, 0, batch(b"[1]"))])
        assert answers[(topic, 0)].error_code == 0
        assert proxy.server.sink.rejections[(topic, "json", INVALID_RECORD)] == 1
    assert stored(upstream, topic) == [b"[1]"], "the acks=0 bad record must not be stored"


def test_acks0_mixed_request_writes_the_valid_partition_then_closes(
    upstream: Upstream, make_topic: Any
) -> None:
    """As a broker does with acks=0: valid partitions are appended, then the connection closes.

    Five rounds, one connection each, so that a race between forwarding and closing shows.
    """
    topic = make_topic(2)
    with run_proxy(upstream.bootstrap, defaults=JSON_ONLY) as proxy:
        for n in range(5):
            parts: list[Part] = [(topic, 0, batch(b"not json")), (topic, 1, batch(b"[%d]" % n))]
            with RawKafkaClient(proxy.host, proxy.port) as client:
                client.send_frame(produce_frame(9, 12, parts, acks=0))
                assert client.is_closed_by_peer(timeout=3)
        deadline = time.monotonic() + 3
        while len(stored(upstream, topic, 1)) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert stored(upstream, topic, 0) == []
    # One connection per round: no order is owed between them, only that nothing is lost.
    assert sorted(stored(upstream, topic, 1)) == [b"[%d]" % n for n in range(5)], (
        "the valid partition of an acks=0 request with a rejection must be written before the "
        "proxy closes the connection"
    )


def test_acks0_good_request_keeps_the_connection_open(upstream: Upstream, make_topic: Any) -> None:
    topic = make_topic(1)
    with (
        run_proxy(upstream.bootstrap, defaults=JSON_ONLY) as proxy,
        RawKafkaClient(proxy.host, proxy.port) as client,
    ):
        client.send_frame(produce_frame(9, 11, [(topic, 0, batch(b'"fine"'))], acks=0))
        assert not client.is_closed_by_peer(timeout=0.5)
        deadline = time.monotonic() + 5
        while not stored(upstream, topic) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert stored(upstream, topic) == [b'"fine"']


def test_acks_2_is_invalid_required_acks_for_every_partition(
    upstream: Upstream, make_topic: Any
) -> None:
    topic = make_topic(2)
    with run_proxy(upstream.bootstrap) as proxy:
        answers = produce(
            proxy.host,
            proxy.port,
            9,
            [(topic, 0, batch(b"a")), (topic, 1, batch(b"b"))],
            acks=2,
        )
    assert [answers[(topic, p)].error_code for p in (0, 1)] == [21, 21]
    assert stored(upstream, topic, 0) == [] and stored(upstream, topic, 1) == []


def test_pipelined_requests_with_a_rejection_in_the_middle_stay_in_order(
    upstream: Upstream, make_topic: Any
) -> None:
    topic = make_topic(1)
    values = [b"[0]", b"[1]", b"not json", b"[3]", b"[4]"]
    frames = [produce_frame(9, 300 + n, [(topic, 0, batch(v))]) for n, v in enumerate(values)]
    with (
        run_proxy(upstream.bootstrap, defaults=JSON_ONLY) as proxy,
        RawKafkaClient(proxy.host, proxy.port) as client,
    ):
        client.send_raw(b"".join(struct.pack(">i", len(f)) + f for f in frames))
        answers = [client.recv_frame(timeout=10) for _ in frames]
    assert [struct.unpack_from(">i", a)[0] for a in answers] == [300, 301, 302, 303, 304]
    parts = [partitions_of(decode_response(a, PRODUCE, 9).body)[(topic, 0)] for a in answers]
    assert [p.error_code for p in parts] == [0, 0, INVALID_RECORD, 0, 0]
    assert [int(p.base_offset) for p in parts] == [0, 1, -1, 2, 3]
    assert record_errors(parts[2])[0][0] == 0
    assert stored(upstream, topic) == [b"[0]", b"[1]", b"[3]", b"[4]"]


# ---- reject: request, modes warn / off ----


def test_reject_request_fails_every_partition(upstream: Upstream, make_topic: Any) -> None:
    topic, other = make_topic(2), make_topic(1)
    with run_proxy(upstream.bootstrap, defaults=JSON_ONLY, reject="request") as proxy:
        answers = produce(
            proxy.host,
            proxy.port,
            9,
            [(topic, 0, batch(b"[1]")), (topic, 1, batch(b"oops")), (other, 0, batch(b"{}"))],
        )
    bad = answers[(topic, 1)]
    assert bad.error_code == INVALID_RECORD and [i for i, _ in record_errors(bad)] == [0]
    for key in ((topic, 0), (other, 0)):
        assert answers[key].error_code == INVALID_RECORD, answers[key]
        assert answers[key].error_message == ANOTHER_PARTITION
        assert record_errors(answers[key]) == []
    assert stored(upstream, topic, 0) == [] and stored(upstream, topic, 1) == []
    assert stored(upstream, other) == []


def test_warn_mode_stores_the_bad_record_and_counts_it(upstream: Upstream, make_topic: Any) -> None:
    topic = make_topic(1)
    topics = [{"match": topic, "mode": "warn", "default_policies": "drop", "policies": ["json"]}]
    with run_proxy(upstream.bootstrap, topics=topics) as proxy:
        answers = produce(proxy.host, proxy.port, 9, [(topic, 0, batch(b"not json"))])
        assert answers[(topic, 0)].error_code == 0
        assert proxy.server.sink.rejections == {(topic, "json", INVALID_RECORD): 1}
    assert stored(upstream, topic) == [b"not json"]


def test_off_mode_stores_the_bad_record_and_counts_nothing(
    upstream: Upstream, make_topic: Any
) -> None:
    topic = make_topic(1)
    topics = [{"match": topic, "mode": "off", "default_policies": "drop", "policies": ["json"]}]
    with run_proxy(upstream.bootstrap, topics=topics) as proxy:
        answers = produce(proxy.host, proxy.port, 9, [(topic, 0, batch(b"not json"))])
        assert answers[(topic, 0)].error_code == 0
        assert not proxy.server.sink.rejections
    assert stored(upstream, topic) == [b"not json"]


# ---- policies a real client cannot violate ----


def test_batch_integrity_base_offset_and_control_batch(upstream: Upstream, make_topic: Any) -> None:
    topic = make_topic(3)
    parts: list[Part] = [
        (topic, 0, batch(b"a", base_offset=5)),
        (topic, 1, batch(b"b", is_control=True)),
        (topic, 2, batch(b"c")),
    ]
    with run_proxy(upstream.bootstrap) as proxy:
        answers = produce(proxy.host, proxy.port, 9, parts)
    base, control, ok = (answers[(topic, p)] for p in (0, 1, 2))
    assert base.error_code == INVALID_RECORD and record_errors(base) == []
    assert base.error_message in (
        None,
        f"The baseOffset of the record batch in the append to {topic}-0 should be 0, but it is 5",
    ), base
    assert control.error_code == INVALID_RECORD and record_errors(control) == []
    assert control.error_message in (
        None,
        f"Clients are not allowed to write control records in topic partition {topic}-1",
    ), control
    assert ok.error_code == 0
    assert stored(upstream, topic, 0) == [] and stored(upstream, topic, 1) == []
    assert stored(upstream, topic, 2) == [b"c"]


def test_batch_integrity_two_batches_in_one_partition(upstream: Upstream, make_topic: Any) -> None:
    topic = make_topic(1)
    with run_proxy(upstream.bootstrap) as proxy:
        answers = produce(proxy.host, proxy.port, 9, [(topic, 0, batch(b"a") + batch(b"b"))])
    assert answers[(topic, 0)].error_code == INVALID_RECORD
    assert stored(upstream, topic) == []


def _non_incremental_batch() -> bytes:
    """Two records with offset deltas 0 and 2 (last offset delta 2, count 2)."""
    builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 2**31 - 1)
    now = int(time.time() * 1000)
    builder.append(0, now, b"k", b"first", [])
    builder.append(2, now, b"k", b"second", [])
    return bytes(builder.build())


def test_offsets_policy_rejects_non_incremental_inner_offsets(
    upstream: Upstream, make_topic: Any
) -> None:
    topic = make_topic(2)
    raw = _non_incremental_batch()
    with run_proxy(upstream.bootstrap, defaults={"policies": ["crc", "offsets"]}) as proxy:
        answers = produce(proxy.host, proxy.port, 9, [(topic, 0, raw), (topic, 1, batch(b"ok"))])
    bad = answers[(topic, 0)]
    assert bad.error_code == INVALID_RECORD, bad
    errors = record_errors(bad)
    assert [i for i, _ in errors] == [1]
    assert errors[0][1].startswith("Inner record DefaultRecord(offset=2, timestamp=")
    assert errors[0][1].endswith(
        "key=1 bytes, value=6 bytes) inside the compressed record batch does not have "
        f"incremental offsets, expected offset is 1 in topic partition {topic}-0."
    )
    assert bad.error_message == kafka_message(errors)
    assert answers[(topic, 1)].error_code == 0
    assert stored(upstream, topic, 0) == []
    assert stored(upstream, topic, 1) == [b"ok"]


def test_message_format_idempotent_and_transactional_batches_need_magic_2(
    upstream: Upstream, make_topic: Any
) -> None:
    topic = make_topic(3)
    policies = {"policies": [{"message_format": {"topic_magic": 1}}]}
    parts: list[Part] = [
        (topic, 0, batch(b"idem", producer_id=4000, producer_epoch=0, base_sequence=0)),
        (
            topic,
            1,
            batch(
                b"txn", producer_id=4001, producer_epoch=0, base_sequence=0, is_transactional=True
            ),
        ),
        (topic, 2, batch(b"plain")),
    ]
    with run_proxy(upstream.bootstrap, defaults=policies) as proxy:
        # a transactional batch needs a transactional id (without one the request is refused
        # as a whole: test_produce_refusals.py)
        answers = produce(proxy.host, proxy.port, 9, parts, transactional_id="txn")
    idem, txn, ok = (answers[(topic, p)] for p in (0, 1, 2))
    assert idem.error_code == 43, idem
    assert idem.error_message in (None, "Idempotent records cannot be used with magic version 1")
    assert txn.error_code == 43, txn
    assert txn.error_message in (None, "Transactional records cannot be used with magic version 1")
    assert ok.error_code == 0
    assert stored(upstream, topic, 0) == [] and stored(upstream, topic, 1) == []
    assert stored(upstream, topic, 2) == [b"plain"]


def test_message_format_min_magic_on_produce_v2_is_legacy_corrupt_message(
    upstream: Upstream, make_topic: Any
) -> None:
    """A magic 1 message set under min_magic 2, sent with Produce v2: the legacy answer.

    (Answered locally: Tansu would drop the connection on a magic 1 message set.)
    """
    topic = make_topic(1)
    with run_proxy(
        upstream.bootstrap, defaults={"policies": [{"message_format": {"min_magic": 2}}]}
    ) as proxy:
        answers = produce(proxy.host, proxy.port, 2, [(topic, 0, batch(b"old", magic=1))])
    assert answers[(topic, 0)].error_code == CORRUPT_MESSAGE
    assert stored(upstream, topic) == []


def test_producer_state_sequence_gap_and_epoch_regression(
    upstream: Upstream, make_topic: Any
) -> None:
    topic = make_topic(1)
    tid = f"tx-{topic}"
    pid, epoch = init_producer_id(upstream, tid)

    def idem(value: bytes, epoch: int, seq: int) -> bytes:
        return batch(value, producer_id=pid, producer_epoch=epoch, base_sequence=seq)

    policies = {"policies": ["batch_integrity", "producer_state"]}
    with run_proxy(upstream.bootstrap, defaults=policies) as proxy:

        def send(raw: bytes) -> Any:
            return produce(proxy.host, proxy.port, 9, [(topic, 0, raw)])[(topic, 0)]

        first = send(idem(b"s0", epoch, 0))
        assert first.error_code == 0, first  # the proxy learns from the broker's answer
        gap = send(idem(b"s5", epoch, 5))
        assert gap.error_code == 45, gap
        assert gap.error_message in (
            None,
            f"Out of order sequence number for producer {pid} at offset 0 in partition "
            f"{topic}-0: 5 (incoming seq. number), 0 (current end sequence number)",
        ), gap
        nxt = send(idem(b"s1", epoch, 1))
        assert nxt.error_code == 0, nxt
        _, bumped_epoch = init_producer_id(upstream, tid)
        assert bumped_epoch == epoch + 1
        bumped = send(idem(b"e1", bumped_epoch, 0))
        assert bumped.error_code == 0, bumped
        stale = send(idem(b"e0", epoch, 2))
        assert stale.error_code == 47, stale  # answered by the proxy (Tansu would say 90)
        assert stale.error_message in (
            None,
            f"Epoch of producer {pid} at offset 0 in {topic}-0 is {epoch}, which is smaller "
            f"than the last seen epoch {bumped_epoch}",
        ), stale
        assert proxy.server.sink.rejections == {
            (topic, "producer_state", 45): 1,
            (topic, "producer_state", 47): 1,
        }
    assert stored(upstream, topic) == [b"s0", b"s1", b"e1"]


def test_acks_policy_refuses_acks_1_on_its_topic_only(upstream: Upstream, make_topic: Any) -> None:
    strict, relaxed = make_topic(1), make_topic(1)
    topics = [
        {"match": strict, "default_policies": "drop", "policies": [{"acks": {"allowed": [-1]}}]}
    ]
    with run_proxy(upstream.bootstrap, topics=topics) as proxy:
        answers = produce(
            proxy.host,
            proxy.port,
            9,
            [(strict, 0, batch(b"a")), (relaxed, 0, batch(b"b"))],
            acks=1,
        )
    bad = answers[(strict, 0)]
    assert bad.error_code == 21, bad
    assert bad.error_message in (None, f"acks=1 is not allowed for topic {strict} (allowed: -1)")
    assert answers[(relaxed, 0)].error_code == 0
    assert stored(upstream, strict) == []
    assert stored(upstream, relaxed) == [b"b"]
